def run(pair):
    pass

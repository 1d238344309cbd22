FROM python:3.11-slim
WORKDIR /opt/kbroker
COPY . .
RUN pip install --no-cache-dir .
EXPOSE 9092
CMD ["kbroker", "configs/server.properties", "--override", "listeners=PLAINTEXT://0.0.0.0:9092"]

# kbroker in a small image: python slim, non-root, data on a volume, health checked over the Kafka protocol.
#   docker build -t kbroker . && docker run -p 9092:9092 -v kbroker-data:/data kbroker
FROM python:3.11-slim AS build
WORKDIR /src
# gcc builds the optional C record walk (protocol/_record_walk.c) into the wheel; the runtime image has none.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY kbroker kbroker
COPY broker broker
COPY protocol protocol
COPY storage storage
COPY coordinator coordinator
COPY console console
COPY kbroker_tools kbroker_tools
COPY spark_jobs spark_jobs
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /data --no-create-home kbroker \
    && mkdir -p /data /etc/kbroker && chown kbroker /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY configs/server.properties /etc/kbroker/server.properties
USER kbroker
WORKDIR /data
VOLUME ["/data"]
EXPOSE 9092
# Listen on every interface in the container; clients outside it are told localhost:9092 (publish the port as
# 9092, or override advertised.listeners).
ENV KBROKER_LISTEN="PLAINTEXT://0.0.0.0:9092" KBROKER_ADVERTISE="PLAINTEXT://localhost:9092"
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-m", "kbroker_tools.healthcheck", "127.0.0.1:9092"]
ENTRYPOINT ["sh", "-c", "exec kbroker /etc/kbroker/server.properties --override listeners=$KBROKER_LISTEN --override advertised.listeners=$KBROKER_ADVERTISE --override log.dirs=/data/logs \"$@\"", "kbroker"]

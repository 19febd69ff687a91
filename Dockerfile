# The granary image the Kubernetes manifests name (deploy/k8s, docs/kubernetes.md): one image
# for shards, trainers, serving replicas and ZooKeeper (Debian's zookeeper package).
# Build: docker build -t granary:dev .
#
# Stage 1 builds with the project's own setup script, exactly as a developer machine does.
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN bash scripts/setup && make -j"$(nproc)" build/granary

# Stage 2: Debian 12 with the run-time libraries of what scripts/setup installs for building
# (the -dev packages' libraries), Debian's ZooKeeper, and the program.
FROM debian:12-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libcjson1 libxxhash0 libopenblas0 libzstd1 libssl3 libevent-core-2.1-7 \
      libevent-pthreads-2.1-7 libmicrohttpd12 libzookeeper-mt2 libsqlite3-0 zookeeper \
      ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --home-dir /data --create-home granary \
 && mkdir -p /ckpt /var/lib/zookeeper && chown granary:granary /ckpt /var/lib/zookeeper
COPY --from=build /src/build/granary /usr/local/bin/granary
USER granary
WORKDIR /data
EXPOSE 7000 9400 9401 8080
ENTRYPOINT []
CMD ["granary", "--help"]

# syntax=docker/dockerfile:1
# entitlement-fleet container image: one `fleet` binary; the Deployment's args pick the subcommand
# (worker | sink | migrate).
#   docker build -t entitlement-fleet:dev .
# Builder and runtime are both Debian 12 (bookworm), so librdkafka-dev and librdkafka1 are the same
# librdkafka (2.0.2) the binary is built against.

ARG SWIFT_IMAGE=swift:6.3-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
# Debian bookworm's librdkafka; builder and runtime must carry the same one.
ARG LIBRDKAFKA_VERSION=2.0.2-1

# ---- build ----
FROM ${SWIFT_IMAGE} AS builder
ARG LIBRDKAFKA_VERSION
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       "librdkafka-dev=${LIBRDKAFKA_VERSION}" "librdkafka1=${LIBRDKAFKA_VERSION}" pkg-config=1.8.1-1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Resolve dependencies in their own layer: source edits do not refetch packages.
COPY Package.swift ./
RUN swift package resolve
COPY Sources ./Sources
COPY Tests ./Tests
# The README's release build, with the Swift runtime linked statically into the binary.
RUN swift build -c release --product fleet --static-swift-stdlib \
    && install -D -m 0755 "$(swift build -c release --show-bin-path)/fleet" /out/fleet \
    && install -D -m 0755 /usr/libexec/swift/linux/swift-backtrace-static /out/swift-backtrace-static

# ---- runtime ----
FROM ${RUNTIME_IMAGE} AS runtime
ARG LIBRDKAFKA_VERSION
# ca-certificates is deliberately unpinned: the trust store must follow Debian's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       "librdkafka1=${LIBRDKAFKA_VERSION}" ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 fleet \
    && useradd --system --uid 10001 --gid fleet --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin fleet \
    && mkdir -p /etc/fleet/roots /etc/fleet/products
COPY --from=builder /out/fleet /usr/local/bin/fleet
# Symbolicated crash backtraces in the logs, without a Swift toolchain in the image.
COPY --from=builder /out/swift-backtrace-static /usr/local/bin/swift-backtrace-static
ENV SWIFT_BACKTRACE=enable=yes,sanitize=yes,threads=all,images=all,interactive=no,swift-backtrace=/usr/local/bin/swift-backtrace-static
COPY config/fleet.yaml /etc/fleet/fleet.example.yaml
COPY config/products.example.yaml /etc/fleet/products.example.yaml
USER 10001:10001
WORKDIR /
# metrics, /healthz, /readyz: worker 9090, sink 9091
EXPOSE 9090 9091
ENTRYPOINT ["fleet"]
CMD ["--help"]

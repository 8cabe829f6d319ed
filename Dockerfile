# syntax=docker/dockerfile:1
# Sluice image: the Rust binary (with OTLP trace export, the `otel` feature) on
# distroless (glibc + libgcc, no shell), non-root.
#   docker build -t sluice .
#   docker run -p 8081:8081 -p 8080:8080 sluice            # serves config/ (example rules)
#   docker run -v $PWD/rules:/etc/sluice/rules:ro sluice   # your rules
# The build needs no protoc (build.rs uses a vendored one). The release workflow
# (.github/workflows/release.yml) builds it natively for linux/amd64 and linux/arm64.
#
# Base images are pinned by digest (a multi-architecture index), so that a rebuild
# uses the bytes that were reviewed; the tag beside each digest says what it is. To move
# to newer ones: `docker buildx imagetools inspect rust:1.95.0-bookworm` (and the
# distroless tag) prints the index digest to paste here.

FROM rust:1.95.0-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
# Not built, but the manifest names them: the workspace member tests/support, the test
# binaries under tests/ and the [[bench]] targets must exist for it to parse.
COPY tests ./tests
COPY benches ./benches
# /out is the final image's tree: the binary, and /bin/ratelimit, the path Envoy
# Gateway runs (as `/bin/ratelimit` without arguments) for envoyproxy/ratelimit.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --features otel --bin sluice \
    && mkdir -p /out/usr/local/bin /out/bin \
    && cp target/release/sluice /out/usr/local/bin/sluice \
    && ln -s /usr/local/bin/sluice /out/bin/ratelimit

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
# The release workflow passes the tag's version, the commit and the repository's URL.
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="A global rate limit service for Envoy: drop-in for envoyproxy/ratelimit" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/ /
COPY config/ /etc/sluice/rules/
# uid/gid 65534 (nobody, in distroless's /etc/passwd): the user Envoy Gateway's pod
# security context runs its rate limit service as, and the Helm chart's default.
USER 65534:65534
# 8081: gRPC (Envoy's rate limit service, grpc.health.v1); 8080: HTTP (probes, metrics).
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice/rules"]

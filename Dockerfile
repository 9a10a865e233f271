# syntax=docker/dockerfile:1
# cluster-api-provider-libvirt manager image.
#
# All stages use Debian 13 (trixie), so the glibc the binary and libvirt were
# built against is the one distroless/cc-debian13 ships.
#
#   docker build -t <registry>/cluster-api-provider-libvirt:<tag> .
#   (or: cargo xtask docker-build --image <registry>/cluster-api-provider-libvirt:<tag>)

FROM docker.io/library/rust:1.95-slim-trixie AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p cluster-api-provider-libvirt --bin cluster-api-provider-libvirt \
 && install -D target/release/cluster-api-provider-libvirt /out/manager

# libvirt.so.0 and exactly the shared libraries it and the manager load,
# minus what distroless/cc already has.
FROM docker.io/library/debian:trixie-slim AS runtime-libs
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt0 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/manager /manager
COPY hack/copy-runtime-libs.sh /copy-runtime-libs.sh
RUN /copy-runtime-libs.sh /rootfs /manager "$(readlink -f /usr/lib/x86_64-linux-gnu/libvirt.so.0)"

FROM gcr.io/distroless/cc-debian13:nonroot
COPY --from=runtime-libs /rootfs/ /
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]

# syntax=docker/dockerfile:1
# cluster-api-provider-libvirt manager image.
#
# All stages use Debian 13 (trixie), so the glibc the binary and libvirt were
# built against is the one distroless/cc-debian13 ships.
#
#   docker build -t <registry>/cluster-api-provider-libvirt:<tag> .
#   (or: cargo xtask docker-build --image <registry>/cluster-api-provider-libvirt:<tag>)
#
# linux/amd64 and linux/arm64: BuildKit sets TARGETARCH, and every stage runs
# on the target platform, so libvirt-dev and libvirt0 are Debian's packages
# of that architecture. For arm64 on an amd64 machine the build stage runs
# under QEMU user emulation (docker buildx with binfmt handlers installed):
# slow, but it needs no cross toolchain and no cross-built libvirt.
#   docker buildx build --platform linux/amd64,linux/arm64 -t <image> --push .

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
ARG TARGETARCH
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt0 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/manager /manager
COPY hack/copy-runtime-libs.sh /copy-runtime-libs.sh
RUN case "${TARGETARCH:-amd64}" in \
      amd64) triplet=x86_64-linux-gnu ;; \
      arm64) triplet=aarch64-linux-gnu ;; \
      *) echo "unsupported TARGETARCH ${TARGETARCH}: build for amd64 or arm64" >&2; exit 1 ;; \
    esac \
 && /copy-runtime-libs.sh /rootfs /manager "$(readlink -f "/usr/lib/${triplet}/libvirt.so.0")"

FROM gcr.io/distroless/cc-debian13:nonroot
COPY --from=runtime-libs /rootfs/ /
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]

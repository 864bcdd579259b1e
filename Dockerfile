# syntax=docker/dockerfile:1
# Build: docker build -t ghcr.io/gpu-admission/gpu-admission:0.1.0 .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin gpu-admission \
    && cp target/release/gpu-admission /gpu-admission

# glibc + libgcc, no shell; runs as 65532 (nonroot).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /gpu-admission /gpu-admission
USER 65532:65532
EXPOSE 3456 3457
ENTRYPOINT ["/gpu-admission"]

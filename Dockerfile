# duetdb server image: `docker build -t duet .` then
#   docker run -p 27017:27017 -v duet-data:/data \
#     -e DUET_INITIAL_ROOT_USER=admin -e DUET_INITIAL_ROOT_PASSWORD_FILE=/run/secrets/duet-root \
#     duet
# Authentication is on (the CMD below): a client outside the container is
# not on its loopback, so the first user comes from the environment (created
# on a fresh /data only; DUET_INITIAL_ROOT_PASSWORD holds the password itself
# if no secret file is used). To run without authentication, which duet
# refuses on a non-loopback address unless told so deliberately:
#   docker run -p 127.0.0.1:27017:27017 duet --allow-unauthenticated-remote
#
# Stage 1 builds the release binary (no debug info: see [profile.release]);
# stage 2 is a small runtime with only that binary, run as a non-root user
# whose data directory is the /data volume.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
# `--locked`: exactly the dependency versions of Cargo.lock.
RUN cargo build --release --locked -p duet \
    && cp target/release/duet /usr/local/bin/duet

FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 duet \
    && useradd --system --uid 10001 --gid duet --home-dir /data --shell /usr/sbin/nologin duet \
    && mkdir -p /data \
    && chown duet:duet /data \
    && chmod 0700 /data
COPY --from=build /usr/local/bin/duet /usr/local/bin/duet
USER duet:duet
VOLUME ["/data"]
EXPOSE 27017
# Listen on every interface inside the container (the host decides what is
# published); SIGTERM (docker stop) shuts down cleanly. Arguments given to
# `docker run` replace the CMD.
ENTRYPOINT ["/usr/local/bin/duet", "serve", "--bind", "0.0.0.0", "--port", "27017", "--data-dir", "/data"]
CMD ["--auth"]

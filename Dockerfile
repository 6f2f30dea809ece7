# tierd as a container image: the service (`tierd serve`) and the operator CLI.
#
#   docker build -t tierd:0.1.0 .                                 # FROM python:3.12-slim
#   docker build --build-arg BASE=python:3.13-slim -t tierd:0.1.0 .
#
# Two stages: the first builds tierd's wheel from this repository (compiling its C batch
# decoder) and installs it with the `s3` extra into a virtualenv; the runtime stage gets that
# virtualenv and nothing else — no pip, no compiler, no network access needed when the container
# runs. The build stage's base (BUILD_BASE) is BASE's Python with a C compiler and its headers:
# python:3.12 for python:3.12-slim; pass the two together
# (--build-arg BASE=python:3.13-slim --build-arg BUILD_BASE=python:3.13).
# `make test-image` builds this same file offline (no registry): BASE and BUILD_BASE are locally
# made Debian images, and pip reads wheels prepared on the host (PIP_NO_INDEX=1,
# PIP_FIND_LINKS=/wheels).
ARG BASE=python:3.12-slim
ARG BUILD_BASE=python:3.12

FROM ${BUILD_BASE} AS build
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md pyspark_tierd.py ./
COPY tierd ./tierd
# The wheel is built from the sources above (PEP 517, setuptools); the virtualenv's own pip and
# setuptools go once tierd is installed: the runtime needs neither. The C extensions (the batch
# decoder and the put_batch encoder) are optional for pip (tierd works without them, at several
# times the CPU per message), not for the image: the build fails if either was not compiled
# (-I: the installed tierd, not the sources in the working directory).
RUN python3 -m venv /opt/tierd \
 && /opt/tierd/bin/python -m pip wheel --no-deps --wheel-dir /tmp/dist . \
 && /opt/tierd/bin/python -m pip install "$(ls /tmp/dist/tierd-*.whl)[s3,grpc]" \
 && /opt/tierd/bin/python -m pip uninstall --yes pip setuptools \
 && /opt/tierd/bin/tierd --version \
 && /opt/tierd/bin/python -I -c "import sys, tierd.format.batch as b, tierd.local.prepare as p; \
sys.exit(0 if b.ACCELERATED and p.ACCELERATED else 'C extension missing: BUILD_BASE needs gcc and Python headers')"

FROM ${BASE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="tierd" \
      org.opencontainers.image.description="RocketMQ-style message store with tiered storage to S3 (sidecar)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/deploy.md"
# No pip at runtime either (python:*-slim ships one); a fixed numeric UID/GID for
# runAsNonRoot; the data directory is the only place written besides /tmp.
RUN if python3 -m pip --version > /dev/null 2>&1; then python3 -m pip uninstall --yes --quiet pip; fi \
 && groupadd --system --gid 10001 tierd \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tierd --no-create-home \
      --shell /usr/sbin/nologin tierd \
 && mkdir -p /var/lib/tierd \
 && chown 10001:10001 /var/lib/tierd
COPY --from=build /opt/tierd /opt/tierd
COPY conf/container.toml /etc/tierd/tierd.toml
ENV PATH=/opt/tierd/bin:$PATH \
    TIERD_CONFIG=/etc/tierd/tierd.toml \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/tierd
USER 10001:10001
# 8080: the data API and 8081: the RocketMQ gRPC API (loopback only: the pod's own containers);
# 8082: health and metrics.
EXPOSE 8080 8081 8082
ENTRYPOINT ["tierd"]
CMD ["serve"]

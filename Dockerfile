# One image for both servers: `holdfast agent serve ...` or `holdfast coordinator serve ...`.
# Build: docker build -t holdfast:0.1.0 .
# BASE: any image with python3 (>= 3.11, with venv) on PATH as `python`, used for both stages.
# scripts/container-test builds on a Debian base made by mmdebstrap (no registry there).

ARG BASE=python:3.11-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
COPY deploy/requirements.lock /src/deploy/requirements.lock
RUN python -m venv /opt/holdfast \
 && /opt/holdfast/bin/pip install --no-cache-dir --no-deps -r /src/deploy/requirements.lock
COPY pyproject.toml README.md /src/
COPY common /src/common
COPY proc /src/proc
COPY agent /src/agent
COPY coordinator /src/coordinator
COPY enrollment /src/enrollment
COPY client /src/client
COPY cli /src/cli
COPY localstack /src/localstack
COPY protos /src/protos
RUN /opt/holdfast/bin/pip install --no-cache-dir --no-deps /src \
 && /opt/holdfast/bin/python -m holdfast.cli --help >/dev/null

FROM ${BASE} AS runtime
COPY --from=build /opt/holdfast /opt/holdfast
ENV PATH=/opt/holdfast/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Non-root by default (the coordinator); the agent DaemonSet overrides to uid 0 with SYS_PTRACE only.
USER 65532:65532
# As that user (it has no passwd entry): the CLI must still build its parsers.
RUN ["/opt/holdfast/bin/holdfast", "coordinator", "serve", "--help"]
EXPOSE 7600 7601
ENTRYPOINT ["/opt/holdfast/bin/holdfast"]
CMD ["--help"]

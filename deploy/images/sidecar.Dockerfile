# The nvrx-slo sidecar: the package with the sidecar extra (no torch, no NVRx), run as a non-root user.
# Build from the repository root:
#   docker build -f deploy/images/sidecar.Dockerfile -t nvrx-slo-sidecar:0.1.0 .
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md /src/
COPY nvrx_slo /src/nvrx_slo
# trainer/ and dashboards/ only because the package build maps every room: the image drops them below.
COPY trainer /src/trainer
COPY exporter /src/exporter
COPY alerts /src/alerts
COPY dashboards /src/dashboards
RUN pip install --no-cache-dir "/src[sidecar]" && rm -rf /src
# What the sidecar never runs: the training-side code and the dashboards' generation.
RUN cd "$(python -c 'import nvrx_slo, pathlib; print(pathlib.Path(nvrx_slo.__file__).parent)')" && rm -r trainer dashboards
# Numeric, so the kubelet can check runAsNonRoot; the manifests run it with a read-only root filesystem.
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["nvrx-slo"]
CMD ["sidecar"]

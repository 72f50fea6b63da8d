# The reference trainer: a CUDA PyTorch base, NVRx 0.4.1 (the version of NVRx's AWS EKS reference, and
# the newest with a wheel for this Ubuntu 22.04 base: 0.5+ need glibc >= 2.39) and the package with the
# trainer extra. The base's torch satisfies the extra's range, so pip keeps it.
# Build from the repository root:
#   docker build -f deploy/images/trainer.Dockerfile -t nvrx-slo-trainer:0.1.0 .
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md /src/
COPY nvrx_slo /src/nvrx_slo
COPY trainer /src/trainer
COPY exporter /src/exporter
COPY alerts /src/alerts
COPY dashboards /src/dashboards
RUN pip install --no-cache-dir "nvidia-resiliency-ext==0.4.1" "/src[trainer]" && rm -rf /src
RUN useradd --uid 10001 --user-group --create-home trainer
USER 10001:10001
WORKDIR /home/trainer

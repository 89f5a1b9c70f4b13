# The cluster image: the pinned Ray's own image (Python 3.11, CUDA) with this repository installed.
# Build and push it where your cluster pulls from, then point cluster/kuberay-rayjob.yaml and cluster/aws-gpu.yaml
# at it:
#   docker build -t YOUR-REGISTRY/loopstudy:0.1.0 . && docker push YOUR-REGISTRY/loopstudy:0.1.0
# CPU-only clusters: docker build --build-arg RAY_IMAGE=rayproject/ray:2.60.0-py311 ...
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311-gpu
FROM ${RAY_IMAGE}

# A C++ compiler builds InfiLoop's fused CPU step on first use (study/models/infiloop_kernel.py); without one
# CPU rollouts use the eager ops (same results, slower).
USER root
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
USER ray
WORKDIR /app
# The package first, so code edits do not re-run the dependency install.
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users study ./study
# The versions pinned in pyproject.toml (Ray's must match the base image's tag; a test checks it). torch==2.13.0
# from PyPI is its CUDA build on Linux x86_64: the GPU path needs nothing else.
RUN pip install --no-cache-dir -e .
COPY --chown=ray:users search_spaces ./search_spaces
COPY --chown=ray:users cluster ./cluster
COPY --chown=ray:users configs ./configs
ENV RAY_USAGE_STATS_ENABLED=0

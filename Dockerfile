# rlalloc's images, one target each, all installing one wheel of the package: the shipped models
# and profiles are package data, so nothing is found through PYTHONPATH or a source tree, and
# nothing but packages is downloaded (the actuator reads the PyTorchJob CRD from the cluster at
# start-up). Build from the repository root, naming the image's target:
#   docker build --target actuator -t ghcr.io/rlalloc/actuator:0.1.0 .           # docs/actuator.md
#   docker build --target trainer-jobs -t ghcr.io/rlalloc/trainer-jobs:0.1.0 .   # docs/trainer_jobs.md
#   docker build --target ray -t ghcr.io/rlalloc/ray:0.1.0 .                     # docs/ray.md

FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rlalloc ./rlalloc
COPY env ./env
COPY agent ./agent
COPY forecaster ./forecaster
COPY actuator ./actuator
COPY trainer_jobs ./trainer_jobs
COPY models ./models
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The in-cluster controller (actuator/deploy/).
FROM runtime AS actuator
# CPU-only torch first (policies run inference only), so the wheel finds its pin satisfied
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY --from=wheel /wheels /wheels
RUN pip install "$(ls /wheels/rlalloc-*.whl)[actuator]" && rm -rf /wheels
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["rlalloc"]
CMD ["actuate"]

# The training job trainer_jobs/manifests/pytorchjob-elastic.yaml runs.
FROM runtime AS trainer-jobs
# torch first, from PyPI: on Linux x86_64 its default wheel bundles the CUDA runtime and NCCL
# (the node provides the driver), and the wheel then finds the pin satisfied
RUN pip install torch==2.13.0
COPY --from=wheel /wheels /wheels
RUN pip install "$(ls /wheels/rlalloc-*.whl)[trainer]" && rm -rf /wheels
# Runs as root: the checkpoint volume (ReadWriteMany, often NFS, where fsGroup does not apply)
# must be writable by the trainer. The PyTorchJob's `command` (torchrun ... -m
# rlalloc.trainer_jobs.train) replaces this default, which only lists the flags.
CMD ["python", "-m", "rlalloc.trainer_jobs.train", "--help"]

# The Ray cluster of rlalloc's sweeps (actuator/raycluster/raycluster.yaml): the [train] and
# [ray] extras, and Ray's own [default] extra, whose dashboard agent serves the health checks
# KubeRay probes (with wget, which it calls). Its Ray and Python must be the ones of the machine
# that drives a sweep: `ray.init` refuses a mismatch.
FROM runtime AS ray
ARG RAY_VERSION=2.60.0
RUN apt-get update && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/*
# CPU-only torch first (simulations and rollouts run on CPUs), so the wheel finds its pin
# satisfied
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY --from=wheel /wheels /wheels
RUN pip install "$(ls /wheels/rlalloc-*.whl)[train,ray]" "ray[default]==${RAY_VERSION}" \
    && rm -rf /wheels
# KubeRay runs `ray start` in this image as the user below; /work is the shared volume
RUN useradd --uid 1000 --create-home ray && mkdir /work && chown ray /work
USER 1000
WORKDIR /work

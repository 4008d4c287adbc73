"""Installs PyTorch for bench/host/run into the running virtual environment, as lightly as this
machine allows: the torch wheel without its dependencies, the pure-Python packages it imports,
numpy, and then only those of torch's pinned CUDA library packages whose libraries the loader
cannot find on this machine (PyPI's Linux torch wheel links the CUDA libraries even when only
the CPU is used). On a machine with no CUDA libraries that ends as the full set; with a CUDA
toolkit installed it is a few packages. PyTorch is a benchmark dependency only.
"""
import re
import subprocess
import sys
from importlib import metadata

PURE = ["filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec", "numpy"]
# A library name in a loader error -> the requirement (from torch's own metadata) providing it.
# Longer names first: libcusparseLt before libcusparse.
LIBRARIES = [
    ("cusparseLt", "nvidia-cusparselt"), ("nvshmem", "nvidia-nvshmem"), ("nccl", "nvidia-nccl"),
    ("cudnn", "nvidia-cudnn"), ("cufile", "cuda-toolkit:cufile"), ("cublas", "cuda-toolkit:cublas"),
    ("cudart", "cuda-toolkit:cudart"), ("cufft", "cuda-toolkit:cufft"),
    ("cusolver", "cuda-toolkit:cusolver"), ("cusparse", "cuda-toolkit:cusparse"),
    ("nvJitLink", "cuda-toolkit:nvjitlink"), ("nvrtc", "cuda-toolkit:nvrtc"),
    ("cupti", "cuda-toolkit:cupti"), ("nvToolsExt", "cuda-toolkit:nvtx"),
]


def pip(*args):
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                   check=True)


def import_error():
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True)
    return None if r.returncode == 0 else r.stderr.strip().splitlines()[-1]


def requirement(package):
    """torch's pinned requirement for `package` ('nvidia-nccl' or 'cuda-toolkit:cufile')."""
    name, _, extra = package.partition(":")
    for req in metadata.requires("torch") or []:
        spec = req.split(";")[0].strip()
        if not spec.lower().startswith(name):
            continue
        if extra:
            version = re.search(r"==\s*([\w.]+)", spec)
            return f"cuda-toolkit[{extra}]" + (f"=={version.group(1)}" if version else "")
        return spec
    return None


def main():
    try:
        metadata.version("torch")
    except metadata.PackageNotFoundError:
        pip("--no-deps", "torch")
        pip(*PURE)
    installed = set()
    for _ in range(len(LIBRARIES) + 1):
        err = import_error()
        if err is None:
            return
        match = next((pkg for lib, pkg in LIBRARIES if lib in err and pkg not in installed), None)
        req = requirement(match) if match else None
        if req is None:
            break
        print(f"bench/host: torch needs {req} ({err})", file=sys.stderr)
        pip("--no-deps", req) if not req.startswith("cuda-toolkit") else pip(req)
        installed.add(match)
    err = import_error()
    if err is not None:  # unknown library: install torch's whole dependency set
        print(f"bench/host: installing torch with all its dependencies ({err})", file=sys.stderr)
        pip("torch")
        if import_error() is not None:
            sys.exit("bench/host: PyTorch does not import: " + import_error())


if __name__ == "__main__":
    main()

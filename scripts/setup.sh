#!/usr/bin/env bash
# Installs everything llmtrain needs to build, test and run its demo on Debian 12, idempotently.
# Prints what it installs; installs nothing that is already present.
#
#   scripts/setup.sh            build + test dependencies (Debian packages, Python oracles)
#   scripts/setup.sh --minimal  only what building and running llmtrain needs
set -euo pipefail
cd "$(dirname "$0")/.."

minimal=0
[[ "${1:-}" == "--minimal" ]] && minimal=1

# Library and tool dependencies. OpenBLAS is the OpenMP variant so that BLAS threads and
# our own OpenMP threads share one pool instead of fighting over the cores. cairo draws
# `llmtrain plot`'s charts (the demo ends with one, so it is here, not among the test packages).
pkgs_build=(
  build-essential cmake pkg-config git
  libcli11-dev libyaml-cpp-dev libfmt-dev nlohmann-json3-dev libpcre2-dev zlib1g-dev libcairo2-dev
  libgtest-dev libgmock-dev
  openmpi-bin libopenmpi-dev libpmix-dev
  libopenblas-openmp-dev
)
# Demo corpus: the English fortunes (real text from a Debian package).
pkgs_demo=(fortunes-min fortunes)
# Test-only: Debian's PyTorch as the reference model, Python venv for the HF oracles,
# real non-English text for the tokenizer parity tests (Chinese and Russian fortunes, Unicode's
# emoji test file),
# Slurm + munge and sshd for launcher tests, iproute2 for two-host network namespaces,
# clang-format for the formatting check, clang with its sanitizer and libFuzzer runtimes and
# OpenMP for the sanitizer build (scripts/sanitize.sh).
pkgs_test=(
  python3 python3-torch python3-numpy python3-venv
  fortunes-zh fortunes-ru unicode-data
  slurm-wlm munge openssh-server openssh-client iproute2 procps psmisc util-linux
  clang-format
  clang libclang-rt-dev libomp-dev
)

want=("${pkgs_build[@]}" "${pkgs_demo[@]}")
[[ $minimal == 1 ]] || want+=("${pkgs_test[@]}")

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) == 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: Debian packages already installed"
fi

# Python oracles from PyPI (Hugging Face tokenizers/safetensors, TensorBoard's event file reader),
# in a venv that also sees Debian's torch. Debian's /usr/bin/python3 is used on purpose: it is the
# one with torch (none of these pulls torch from PyPI).
if [[ $minimal == 0 ]]; then
  venv=.venv
  if [[ ! -x $venv/bin/python ]]; then
    echo "setup: creating Python venv $venv (with Debian's torch visible)"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
  fi
  need_pip=()
  for m in tokenizers safetensors tensorboard; do
    "$venv/bin/python" -c "import $m" 2>/dev/null || need_pip+=("$m")
  done
  if ((${#need_pip[@]})); then
    echo "setup: installing from PyPI into $venv: ${need_pip[*]}"
    "$venv/bin/pip" install -q --disable-pip-version-check "${need_pip[@]}"
  else
    echo "setup: Python oracles already installed (tokenizers, safetensors, tensorboard)"
  fi

  # Hugging Face transformers for the export/import tests (tests/e2e/hf.sh), in its own venv:
  # transformers 4.40.2 works with Debian's torch 1.13 but needs tokenizers < 0.20, while the
  # tokenizer parity tests use the newest tokenizers from .venv.
  hf_venv=.venv-hf
  if [[ ! -x $hf_venv/bin/python ]]; then
    echo "setup: creating Python venv $hf_venv (transformers 4.40.2, with Debian's torch visible)"
    /usr/bin/python3 -m venv --system-site-packages "$hf_venv"
  fi
  if ! "$hf_venv/bin/python" -c "import transformers, safetensors; assert transformers.__version__ == '4.40.2'" 2>/dev/null; then
    echo "setup: installing from PyPI into $hf_venv: transformers==4.40.2 tokenizers<0.20 safetensors"
    "$hf_venv/bin/pip" install -q --disable-pip-version-check "transformers==4.40.2" "tokenizers<0.20" safetensors
  else
    echo "setup: transformers 4.40.2 already installed in $hf_venv"
  fi

  # transformers 5 with PyTorch 2 (scripts/setup_hf5.sh); scripts/test.sh runs it beside the build.
  [[ ${LLMTRAIN_SETUP_HF5:-1} == 0 ]] || scripts/setup_hf5.sh
fi
echo "setup: done"

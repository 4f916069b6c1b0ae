#!/usr/bin/env bash
# Installs everything ringtrain needs into ./.venv, idempotently:
#   OpenMPI, iproute2, openssh, munge and SLURM (apt, only when missing), TensorFlow 2.21, mpi4py,
#   ringtrain itself (editable) and Horovod 0.28.1 built from the PyPI sdist
#   with patches/horovod-0.28.1/*.patch applied.
# A second run with nothing changed takes a few seconds: pip is skipped by a
# stamp file, and the Horovod wheel is cached outside the checkout, keyed by
# the Horovod, TF, Python and MPI versions and the patches' hash.
#
#   scripts/install.sh          # CPU (tensorflow-cpu, Horovod with MPI + Gloo)
#   GPU=1 scripts/install.sh    # GPU (tensorflow[and-cuda], HOROVOD_GPU_OPERATIONS=NCCL)
#   TEST_TOOLS=1 scripts/install.sh   # also what only the tests use: Debian's headless Chromium
#   scripts/install.sh --wheel-only   # (make wheel) build or reuse the Horovod wheel and print where it is,
#                                     # for `pip install` into another environment: docs/keras.md
set -euo pipefail

WHEEL_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --wheel-only) WHEEL_ONLY=1 ;;
        *) echo "install.sh: unknown argument $arg (the one there is: --wheel-only)" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
HOROVOD_VERSION=0.28.1
GPU=${GPU:-0}
CACHE=${RINGTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ringtrain}
say() { echo "[install] $*"; }

# --- 1. OpenMPI, the build tools Horovod needs, and the simulated cluster's tools
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
apt_pkgs=()
has mpirun && has mpicc || apt_pkgs+=(openmpi-bin libopenmpi-dev)
# System CMake 3.x: PyPI's cmake 4 rejects gloo's CMakeLists.
has cmake || apt_pkgs+=(cmake)
has g++ || apt_pkgs+=(g++)
has patch || apt_pkgs+=(patch)
# ringtrain-cluster: namespaces and tc (iproute2), one sshd per simulated host, nsenter.
has ip && has tc || apt_pkgs+=(iproute2)
has sshd || apt_pkgs+=(openssh-server)
has ssh && has ssh-keygen || apt_pkgs+=(openssh-client)
has nsenter || apt_pkgs+=(util-linux)
# ringtrain-cluster up --slurm: a real SLURM (22.05 on bookworm) and its munge.
has munged || apt_pkgs+=(munge)
has slurmctld || apt_pkgs+=(slurmctld)
has slurmd || apt_pkgs+=(slurmd)
has sbatch && has srun || apt_pkgs+=(slurm-client)
# The tests render the bench's HTML report in a real browser (make test sets TEST_TOOLS=1).
[ "${TEST_TOOLS:-0}" = 1 ] && ! has chromium && apt_pkgs+=(chromium)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
    say "installing ${apt_pkgs[*]} with apt"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    # openssh-server, munge and the slurm daemons are wanted for their binaries only:
    # while apt runs, a policy-rc.d (Debian's switch for this) keeps them from
    # starting system services (sshd on port 22, a munged, a slurmctld).
    policy=/usr/sbin/policy-rc.d; ours=""
    if [ ! -e "$policy" ]; then
        ours=$policy
        trap '$SUDO rm -f "$ours"' EXIT
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
        $SUDO chmod +x "$policy"
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
    if [ -n "$ours" ]; then $SUDO rm -f "$ours"; trap - EXIT; fi
fi

# --- 2. virtualenv and Python packages ------------------------------------
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
EXTRA=cpu; [ "$GPU" = 1 ] && EXTRA=gpu
stamp="$VENV/.ringtrain-deps"
# Editable installs map the top-level packages found at install time: a new one needs a reinstall.
want="$( (cat setup.cfg scripts/install.sh; ls -d */__init__.py) | sha256sum | cut -c1-16)-$EXTRA"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing Python packages (.[${EXTRA},test,docs])"
    "${PIP[@]}" install --upgrade pip setuptools wheel
    "${PIP[@]}" install -e ".[${EXTRA},test,docs]"
    echo "$want" >"$stamp"
fi

# --- 3. Horovod, built against the installed TF -------------------------------
# Versions from package metadata: importing TF would cost seconds on every run.
versions=$("$VENV/bin/python" - <<'EOF'
import sys
from importlib import metadata
for dist in ("tensorflow-cpu", "tensorflow"):
    try:
        print(metadata.version(dist), "%d.%d" % sys.version_info[:2])
        break
    except metadata.PackageNotFoundError:
        pass
EOF
)
read -r TF_VERSION PY_VERSION <<<"$versions" || true
[ -n "${TF_VERSION:-}" ] || { say "TensorFlow is not installed in $VENV: rm -rf $VENV and rerun"; exit 1; }
MPI_VERSION=$(mpirun --version 2>/dev/null | head -n1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n1)
PATCH_HASH=$(cat patches/horovod-$HOROVOD_VERSION/*.patch | sha256sum | cut -c1-12)
KEY="horovod-$HOROVOD_VERSION-tf$TF_VERSION-py$PY_VERSION-ompi$MPI_VERSION-$EXTRA-$PATCH_HASH"
hvd_stamp="$VENV/.ringtrain-horovod"

horovod_tf_lib_present() {  # the built extension, found without importing TF
    "$VENV/bin/python" -c "import glob, importlib.util, os, sys
spec = importlib.util.find_spec('horovod')
sys.exit(0 if spec and glob.glob(os.path.join(spec.submodule_search_locations[0], 'tensorflow', 'mpi_lib*.so')) else 1)"
}
if [ "$WHEEL_ONLY" = 0 ] && [ "$(cat "$hvd_stamp" 2>/dev/null)" = "$KEY" ] && horovod_tf_lib_present; then
    say "horovod up to date ($KEY)"
    exit 0
fi

WHEEL_DIR="$CACHE/wheels/$KEY"
if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    say "building $KEY (about 4 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "${PIP[@]}" download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
    tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    for p in patches/horovod-$HOROVOD_VERSION/*.patch; do
        say "applying $p"
        patch -s -p1 -d "$src" <"$p"
    done
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
           HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
    # gloo's CMakeLists predates CMake 4; harmless with the system's 3.25.
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    [ "$GPU" = 1 ] && export HOROVOD_GPU_OPERATIONS=NCCL
    PATH="$VENV/bin:$PATH" MAKEFLAGS="-j$(nproc)" \
        "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$work/dist" "$src"
    mkdir -p "$WHEEL_DIR"
    cp "$work"/dist/horovod-*.whl "$WHEEL_DIR/"
fi
if [ "$WHEEL_ONLY" = 1 ]; then
    wheel=$(ls "$WHEEL_DIR"/horovod-*.whl)
    tf_dist=tensorflow-cpu; [ "$GPU" = 1 ] && tf_dist="tensorflow[and-cuda]"
    say "built against $tf_dist $TF_VERSION and Python $PY_VERSION; it needs OpenMPI $MPI_VERSION's libraries (apt: openmpi-bin)"
    say "into another environment: pip install '$tf_dist==$TF_VERSION', then: pip install $wheel"
    echo "$wheel"  # the last line: the wheel
    exit 0
fi
say "installing cached wheel $WHEEL_DIR"
"${PIP[@]}" install --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl
echo "$KEY" >"$hvd_stamp"

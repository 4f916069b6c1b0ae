#!/usr/bin/env bash
# Inside a SLURM allocation, write an OpenMPI hostfile of its nodes:
#   salloc -N 2 --ntasks-per-node=4 mpi_hostfiles/slurm_to_hostfile.sh > hosts
#   mpirun --hostfile hosts ringtrain --model cifar_resnet --data-dir /data/cifar10
set -euo pipefail
: "${SLURM_JOB_NODELIST:?run this inside a SLURM allocation (salloc/sbatch)}"
slots=${SLURM_NTASKS_PER_NODE:-1}
scontrol show hostnames "$SLURM_JOB_NODELIST" | while read -r host; do
    echo "$host slots=${slots%%(*}"
done

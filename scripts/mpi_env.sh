# Sourced by the scripts: lets Open MPI run as root (CI and the dev machines are root) and place
# more ranks than cores (2-core machines).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

#!/usr/bin/env bash
# device_mpi.sh - add Open MPI to the GPU machine's bundle, so that
# nd.distributed runs there (its image has no MPI, and nothing can be
# installed on it). Run from the project root after the bundle exists:
#
#   bash ../shared/device/bundle.sh && bash scripts/device_mpi.sh
#
# then, on the GPU machine, from the copied checkout's root:
#
#   bash .device/mpi_env.sh mpirun -np 8 --allow-run-as-root .device/build/needle-lua script.lua
#   bash .device/mpi_env.sh .device/build/needle-lua scripts/bench/data_parallel.lua 8 3
#
# It copies Debian's Open MPI (mpirun, its plugins, PMIx's, the help texts)
# laid out as under /usr so that OPAL_PREFIX relocates it, packed as
# .device/ompi.tar.xz (mpi_env.sh unpacks it into $TMPDIR/needle-ompi-<checksum>), and
# the libraries they load into .device/lib. Plugins for fabrics a single
# node does not use (InfiniBand, OFI, UCX, PSM) and the Fortran, C++ and Java
# bindings are left out: about 9 MiB in all.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
[ -d .device/lib ] || { echo "device_mpi.sh: no .device/: run bash ../shared/device/bundle.sh first" >&2; exit 2; }
command -v orterun >/dev/null || { echo "device_mpi.sh: Open MPI is not installed (bash scripts/setup.sh)" >&2; exit 2; }

arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
ompi_lib=/usr/lib/$arch/openmpi/lib
pmix=/usr/lib/$arch/pmix2
dest=.device/ompi
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib/$arch/openmpi/lib/openmpi3" "$dest/share" "$dest/lib/$arch/pmix2/lib/pmix"

cp -L "$(command -v orterun)" "$dest/bin/orterun"
cp -L "$(command -v orted)" "$dest/bin/orted"
ln -s orterun "$dest/bin/mpirun"
ln -s orterun "$dest/bin/mpiexec"

skip='openib|ofi|ucx|psm|verbs|java|mpifh|usempi|cxx|_dbg_'
# the plugins one node needs (the bundle and the checkout must stay under
# 64 MiB together): no MPI-IO, one-sided, OpenSHMEM, fabric or batch-system ones
keep='mca_(allocator|bml|btl_(self|vader|tcp)|coll_(basic|libnbc|self|sm|tuned|inter|sync)|errmgr|ess_(env|hnp|pmi|singleton|tool)|filem|grpcomm|iof|odls|oob|op_|patcher|plm_(isolated|rsh)|pmix_(ext3x|isolated)|pml_ob1|pstat|ras_simulator|rcache|reachable|regx|rmaps|rml|routed|rtc|schizo_(ompi|orte)|shmem|state|topo_basic|mpool)'
for so in "$ompi_lib"/openmpi3/*.so; do
  if basename "$so" | grep -Eq "^$keep"; then cp -L "$so" "$dest/lib/$arch/openmpi/lib/openmpi3/"; fi
done
for so in "$ompi_lib"/libmca_common_*.so*; do
  if ! basename "$so" | grep -Eq "$skip"; then cp -L "$so" "$dest/lib/$arch/openmpi/lib/"; fi
done
cp -L "$pmix"/lib/pmix/*.so "$dest/lib/$arch/pmix2/lib/pmix/"
cp -rL "$pmix/share" "$dest/lib/$arch/pmix2/"
cp -rL /usr/share/openmpi "$dest/share/"
# mpi.h: scripts/bench/allreduce.lua compiles its C yardstick there (no
# mpicc wrapper: NEEDLE_MPI_CC/NEEDLE_MPI_LIBS, linked to .device/lib's libmpi)
mkdir -p "$dest/include"
cp -L /usr/lib/$arch/openmpi/include/mpi.h /usr/lib/$arch/openmpi/include/mpi_portable_platform.h "$dest/include/"
[ -d /usr/share/pmix ] && cp -rL /usr/share/pmix "$dest/share/"

# the libraries all of these load, beside needle-lua's in .device/lib
{
  ldd "$dest/bin/orterun" "$dest/bin/orted"
  ldd "$dest"/lib/"$arch"/openmpi/lib/openmpi3/*.so "$dest"/lib/"$arch"/openmpi/lib/*.so "$dest"/lib/"$arch"/pmix2/lib/pmix/*.so
} 2>/dev/null | awk '/=> \// {print $3}' | sort -u | while read -r so; do
  case "$(basename "$so")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    *) [ -e ".device/lib/$(basename "$so")" ] || cp -L "$so" .device/lib/ ;;
  esac
done

cat > .device/mpi_env.sh <<'EOF'
#!/usr/bin/env bash
# mpi_env.sh - run a command with the bundle's Open MPI (scripts/device_mpi.sh),
# through env.sh (which sets the library and Lua paths):
#   bash .device/mpi_env.sh mpirun -np 8 --allow-run-as-root .device/build/needle-lua script.lua
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ompi=${TMPDIR:-/tmp}/needle-ompi-$(cksum < "$here/ompi.tar.xz" | cut -d' ' -f1)
if [ ! -x "$ompi/ompi/bin/orterun" ]; then
  mkdir -p "$ompi" && tar -C "$ompi" -xJf "$here/ompi.tar.xz"
fi
ompi=$ompi/ompi
arch=$(ls "$ompi/lib" | head -1)
export OPAL_PREFIX="$ompi"
export PMIX_PREFIX="$ompi/lib/$arch/pmix2"
export PMIX_MCA_mca_base_component_path="$ompi/lib/$arch/pmix2/lib/pmix"
export PATH="$ompi/bin:$PATH"
export NEEDLE_MPI_CC="cc -I$ompi/include" NEEDLE_MPI_LIBS="$here/lib/libmpi.so.40"
# the image runs as root, in a container: mpirun must be told that is fine
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec bash "$here/env.sh" "$@"
EOF
# packed (xz: a third of the size): mpi_env.sh unpacks it there, once
tar -C .device -cJf .device/ompi.tar.xz ompi
rm -rf "$dest"
# what a device call carries: the working tree and .device, 64 MiB at most
tree_kib=$(git ls-files -z --cached --others --exclude-standard | du -c --files0-from=- -k 2>/dev/null | tail -1 | cut -f1)
dev_kib=$(du -sk .device | cut -f1)
echo "device_mpi.sh: .device $((dev_kib / 1024)) MiB, with the checkout $(( (tree_kib + dev_kib) / 1024 )) MiB (a device call carries at most 64)"

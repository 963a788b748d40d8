#!/usr/bin/env bash
# install:consumer — libmwms installed and used the way a user does it, with no LD_LIBRARY_PATH:
#  1. `cmake --install` of the tested build into a fresh prefix: the library's SONAME and links
#     (libmwms.so -> libmwms.so.0 -> libmwms.so.X.Y.Z), each installed executable's RUNPATH
#     ($ORIGIN/<bin-to-lib>, nothing from the build tree), mwms-doctor runs from the prefix and
#     from a copy of it elsewhere;
#  2. examples/consumer built against that prefix with find_package(mwms) and with pkg-config
#     (Makefile), both run and must print the right all-reduce;
#  3. a static library-only build of the same sources (BUILD_SHARED_LIBS=OFF, MPI and CUDA as in
#     the tested build), installed, and the consumer built and run against it both ways
#     (pkg-config --static), which checks mwmsConfig.cmake's find_dependency and mwms.pc's
#     private fields against what libmwms.a really needs.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR BINDIR WITH_MPI WITH_CUDA SHARED
#                        CXX_COMPILER CMAKE_COMMAND VERSION     (WITH_*/SHARED: ON or OFF)
set -euo pipefail
build=$1 src=$2 work=$3 libdir=$4 bindir=$5 with_mpi=$6 with_cuda=$7 shared=$8 cxx=$9
cmake=${10} version=${11}
# Everything below must find its libraries through RUNPATH alone.
unset LD_LIBRARY_PATH
jobs=${MWMS_INSTALL_TEST_JOBS:-2}
rm -rf "$work"
mkdir -p "$work"

fail() { echo "FAIL: $*"; exit 1; }
logged() {  # logged LOG COMMAND...: runs COMMAND into LOG; on failure shows the log's end and fails
  local log=$1
  shift
  "$@" > "$log" 2>&1 || { echo "FAIL: $* (log $log)"; tail -40 "$log"; exit 1; }
}
dynamic() { readelf -d "$1" 2>/dev/null; }
# The one RUNPATH every installed executable must carry (Note [install rpath]).
expected_rpath="\$ORIGIN/$(realpath -m --relative-to="/p/$bindir" "/p/$libdir")"

# check_prefix PREFIX SHARED: the installed files of a prefix.
check_prefix() {
  local prefix=$1 is_shared=$2 lib=$1/$libdir
  for f in "$lib/cmake/mwms/mwmsConfig.cmake" "$lib/cmake/mwms/mwmsConfigVersion.cmake" \
           "$lib/pkgconfig/mwms.pc" "$prefix/include/mwms/mwms.h" "$prefix/include/mwms/config.h"; do
    [ -f "$f" ] || fail "$f not installed"
  done
  if [ "$is_shared" = ON ]; then
    [ "$(readlink "$lib/libmwms.so")" = libmwms.so.0 ] || fail "libmwms.so does not link to libmwms.so.0"
    [ "$(readlink "$lib/libmwms.so.0")" = "libmwms.so.$version" ] ||
      fail "libmwms.so.0 does not link to libmwms.so.$version"
    grep -q 'SONAME.*\[libmwms\.so\.0\]' <<<"$(dynamic "$lib/libmwms.so.$version")" ||
      fail "SONAME of libmwms.so.$version is not libmwms.so.0"
    [ ! -e "$lib/libmwms.a" ] || fail "a shared build installed libmwms.a"
  else
    [ -f "$lib/libmwms.a" ] || fail "libmwms.a not installed"
    ! compgen -G "$lib/libmwms.so*" > /dev/null || fail "a static build installed libmwms.so"
  fi
  local checked=0 exe
  for exe in "$prefix/$bindir"/*; do
    grep -q 'NEEDED.*\[libmwms\.so\.0\]' <<<"$(dynamic "$exe")" || continue
    local rpath
    rpath=$(dynamic "$exe" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
    [ "$rpath" = "$expected_rpath" ] ||
      fail "$(basename "$exe") has RUNPATH '$rpath', expected '$expected_rpath'"
    checked=$((checked + 1))
  done
  if [ "$is_shared" = ON ] && [ "$checked" -eq 0 ]; then fail "no installed executable uses libmwms.so.0"; fi
  logged "$work/doctor.log" "$prefix/$bindir/mwms-doctor" --json
  grep -q '"num_workers": *1' "$work/doctor.log" || { cat "$work/doctor.log"; fail "mwms-doctor --json"; }
  logged "$work/doctor-help.log" "$prefix/$bindir/mwms-doctor" --help
  echo "ok prefix $prefix (shared $is_shared, $checked executables with RUNPATH $expected_rpath)"
}

# check_consumers PREFIX TAG SHARED: examples/consumer against PREFIX, through CMake and pkg-config.
check_consumers() {
  local prefix=$1 tag=$2 is_shared=$3 out
  local expected="rank 0 of 1, all_reduce sum = \[1 2 \.\.\. 8\]$"
  # find_package(mwms)
  logged "$work/$tag-cmake-configure.log" env -u TF_CONFIG "$cmake" -S "$src/examples/consumer" \
    -B "$work/$tag-cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=Release
  # NCCL comes with CUDA (cmake/mwms_cuda.cmake): mwms_WITH_NCCL must equal mwms_WITH_CUDA.
  grep -q "mwms $version: MPI $with_mpi, CUDA $with_cuda, NCCL $with_cuda, shared $is_shared" \
    "$work/$tag-cmake-configure.log" || { cat "$work/$tag-cmake-configure.log"; fail "$tag: mwms_* variables"; }
  grep -qx "mwms_DIR:PATH=$prefix/$libdir/cmake/mwms" "$work/$tag-cmake/CMakeCache.txt" ||
    fail "$tag: find_package(mwms) found another mwms: $(grep '^mwms_DIR' "$work/$tag-cmake/CMakeCache.txt")"
  logged "$work/$tag-cmake-build.log" "$cmake" --build "$work/$tag-cmake"
  out=$(env -u TF_CONFIG "$work/$tag-cmake/mwms_consumer") || fail "$tag: cmake consumer: $out"
  grep -q "$expected" <<<"$out" || fail "$tag: cmake consumer printed: $out"
  echo "ok $tag find_package: $out"
  # pkg-config, through the example's Makefile
  mkdir -p "$work/$tag-pc"
  local static=0
  [ "$is_shared" = ON ] || static=1
  logged "$work/$tag-pc-build.log" env PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" \
    make -C "$src/examples/consumer" OUT="$work/$tag-pc" CXX="$cxx" STATIC=$static
  out=$(env -u TF_CONFIG "$work/$tag-pc/mwms_consumer") || fail "$tag: pkg-config consumer: $out"
  grep -q "$expected" <<<"$out" || fail "$tag: pkg-config consumer printed: $out"
  if [ "$is_shared" = ON ]; then
    grep -q 'NEEDED.*\[libmwms\.so\.0\]' <<<"$(dynamic "$work/$tag-pc/mwms_consumer")" ||
      fail "$tag: pkg-config consumer does not link libmwms.so.0"
  else
    ! grep -q 'libmwms\.so' <<<"$(dynamic "$work/$tag-pc/mwms_consumer")" ||
      fail "$tag: static consumer needs libmwms.so"
  fi
  echo "ok $tag pkg-config: $out"
}

# 1-2. The tested build, installed.
logged "$work/install.log" "$cmake" --install "$build" --prefix "$work/prefix"
check_prefix "$work/prefix" "$shared"
# The prefix is relocatable: a copy elsewhere still runs, and its mwms.pc names the new place.
cp -a "$work/prefix" "$work/prefix-moved"
rm -rf "$work/prefix"
check_prefix "$work/prefix-moved" "$shared"
pc_prefix=$(PKG_CONFIG_PATH="$work/prefix-moved/$libdir/pkgconfig" pkg-config --variable=prefix mwms)
[ "$(realpath "$pc_prefix")" = "$(realpath "$work/prefix-moved")" ] || fail "mwms.pc prefix is $pc_prefix"
check_consumers "$work/prefix-moved" main "$shared"

# 3. A static, library-only build of the same sources.
logged "$work/static-configure.log" "$cmake" -S "$src" -B "$work/static-build" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DBUILD_SHARED_LIBS=OFF \
  -DMWMS_BUILD_TESTS=OFF -DMWMS_BUILD_BENCH=OFF -DMWMS_BUILD_EXAMPLES=OFF \
  -DMWMS_WITH_MPI="$with_mpi" -DMWMS_WITH_CUDA="$with_cuda"
logged "$work/static-build.log" "$cmake" --build "$work/static-build" -j "$jobs"
logged "$work/static-install.log" "$cmake" --install "$work/static-build" --prefix "$work/prefix-static"
check_prefix "$work/prefix-static" OFF
if [ "$with_mpi" = ON ]; then
  grep -Eq '^(Requires\.private: .*mpi|Libs\.private: .*mpi)' "$work/prefix-static/$libdir/pkgconfig/mwms.pc" ||
    fail "static mwms.pc does not name MPI: $(cat "$work/prefix-static/$libdir/pkgconfig/mwms.pc")"
fi
check_consumers "$work/prefix-static" static OFF
echo "ok install:consumer"

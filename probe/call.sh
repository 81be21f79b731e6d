# The next device call for branch w8a8 (from the repo root, carry [".gpu-bundle-xz"]): the E4M3
# kernel test, an A/B of main (dspark-base) against E4M3 activations and row-exact attention
# alone, the gpu_model FP8 tests, FP8 projections at 7 rows both ways, the probe, gpu_kernels fp8.
set -uo pipefail
rm -rf .gpu-bundle; bash scripts/unbundle.sh; export DSPARK_ROOT=$PWD
B=.gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== T1 a8 kernel test"; timeout 100 $B/gpu_kernels --test-threads=1 --nocapture fp8_e4m3 2>&1 | grep -E "E4M3|panicked|assert|result|^test " | tail -10
echo "SECONDS=$SECONDS"
F='--no-projections --weights fp8 --contexts 512,4096 --iters 8 --prefill 512 --prefill-iters 1'
for r in 1 2; do
 for c in "dspark-base" "dspark A8" "dspark RX" "dspark"; do
  set -- $c
  echo "== round $r: $c"
  case "${2:-}" in A8) export DSPARK_FP8_A8=1;; # the same as --activations e4m3
  RX) export DSPARK_ROW_EXACT=1;; esac
  timeout 60 $B/$1 bench $F 2>&1 | grep -E '^\| (decode|verify8|draft_round|round)_fp8 |copy ceiling [0-9]'
  unset DSPARK_FP8_A8 DSPARK_ROW_EXACT
 done
done
echo "SECONDS=$SECONDS"
echo "== T2 gpu_model fp8"; timeout 100 $B/gpu_model --test-threads=1 fp8 2>&1 | grep -E "^test |panicked|assert|result" | head -12
echo "SECONDS=$SECONDS"
for rows in 1 7; do for e in "X=1" "DSPARK_FP8_A8=1"; do echo "== projections rows=$rows $e"; env $e timeout 40 $B/dspark bench --weights fp8 --projections-only --projection-rows $rows --iters 20 2>&1 | grep -E "_fp8 \|" ; done; done
echo "SECONDS=$SECONDS"
if [ $SECONDS -lt 330 ]; then echo "== probe"; [ -x probe/w8a8.bin ] || nvcc -O3 -std=c++17 -arch=sm_90a probe/w8a8.cu -o probe/w8a8.bin; timeout 100 ./probe/w8a8.bin 2>&1 | grep -vE "check.*ok$" | head -80; fi
echo "SECONDS=$SECONDS"
if [ $SECONDS -lt 420 ]; then echo "== T3 gpu_kernels fp8 (A8 off)"; timeout 60 $B/gpu_kernels --test-threads=1 fp8 2>&1 | grep -E "^test |result" | tail -12; fi
echo "SECONDS=$SECONDS"

# prebuilt_env.sh — sourced on the H200 after h200_env.sh: unpacks .prebuilt/bins.tar.xz
# (tests/cuda/prebuild.sh) into B=/tmp/pre and puts it on LD_LIBRARY_PATH. The binaries were
# built against the CPU machine's cuDNN 9.19; the H200's own is 9.14, and the cudnn row refuses
# to run on another minor version than its headers' (mixing them crashed), so LK_TORCH_CUDNN
# names torch's wheel's copy (9.19): LD_LIBRARY_PATH=$LK_TORCH_CUDNN:$LD_LIBRARY_PATH
# "$B/cuda_test_attention" runs the cudnn cases too (inside torch's process it is loaded anyway).
B=/tmp/pre
mkdir -p "$B" && tar -xJf .prebuilt/bins.tar.xz -C "$B" && echo "prebuilt: $(head -1 .prebuilt/rev)"
export B LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# the A side of an A/B (ALT=<rev> prebuild.sh), when packed: A=/tmp/alt, not on the library path
# (bench/ab.sh puts each side first in turn)
if [ -f .prebuilt/alt.tar.xz ]; then
  A=/tmp/alt
  mkdir -p "$A" && tar -xJf .prebuilt/alt.tar.xz -C "$A" && echo "alt: $(head -1 .prebuilt/alt_rev)"
  export A
fi
LK_TORCH_CUDNN=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null || true)
export LK_TORCH_CUDNN

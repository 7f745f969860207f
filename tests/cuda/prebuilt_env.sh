# prebuilt_env.sh — sourced on the H200 after h200_env.sh: unpacks .prebuilt/bins.tar.xz
# (tests/cuda/prebuild.sh) into B=/tmp/pre and puts it on LD_LIBRARY_PATH. The binaries were
# built against the CPU machine's cuDNN 9.19; the H200's own is 9.14, and the cudnn row refuses
# to run on another minor version than its headers' (mixing them crashed), so LK_TORCH_CUDNN
# names torch's wheel's copy (9.19): LD_LIBRARY_PATH=$LK_TORCH_CUDNN:$LD_LIBRARY_PATH
# "$B/cuda_test_attention" runs the cudnn cases too (inside torch's process it is loaded anyway).
B=/tmp/pre
mkdir -p "$B" && tar -xJf .prebuilt/bins.tar.xz -C "$B" && echo "prebuilt: $(head -1 .prebuilt/rev)"
export B LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# the other sides of an A/B (ALT=<rev> [ALT_NAME=<name>] prebuild.sh), each unpacked into
# /tmp/<name>, not on the library path (bench/ab.sh puts each side first in turn); alt is A
for t in .prebuilt/*.tar.xz; do
  n=$(basename "$t" .tar.xz)
  [ "$n" = bins ] && continue
  mkdir -p "/tmp/$n" && tar -xJf "$t" -C "/tmp/$n" && echo "$n: $(head -1 ".prebuilt/${n}_rev")"
done
[ -d /tmp/alt ] && export A=/tmp/alt
LK_TORCH_CUDNN=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null || true)
export LK_TORCH_CUDNN

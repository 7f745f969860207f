#!/usr/bin/env bash
# stop_rank.sh — a rank stopped with SIGSTOP ends the job within train.comm_timeout_s,
# with the watchdog's message naming the collective, the rank and the step (issue 20,
# item 5; comm.h: lk_comm_watchdog_arm). `mpirun -np 2 llmkern train` with parallel
# dp 2 runs a long training; once rank 0 has printed step 2, rank 1 is sent SIGSTOP;
# rank 0's next collective must give up after the 3 s timeout and mpirun end the job.
# Run: bash tests/dist/stop_rank.sh build/llmkern mpiexec
set -u
bin=$1; mpi=$2
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
cat >"$tmp/dp2.yaml" <<'YAML'
model: { hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16,
         intermediate_size: 64, vocab_size: 320, torch_dtype: float32 }
train: { steps: 100000, batch_size: 2, seq_len: 32, save_every: 0, warmup_steps: 1, comm_timeout_s: 3 }
data: { corpus: builtin, docs: 32 }
parallel: { dp: 2 }
YAML
export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS=detect_leaks=0
"$mpi" --oversubscribe --allow-run-as-root -np 2 "$bin" train --config "$tmp/dp2.yaml" --out "$tmp/run" \
  >"$tmp/log" 2>&1 &
job=$!
pids+=("$job")
# (mpirun may hand the ranks a terminal: the progress line is then rewritten in place)
for _ in $(seq 600); do grep -aq 'step 2/' "$tmp/log" && break; sleep 0.1; done
grep -aq 'step 2/' "$tmp/log" || { echo "FAIL: the job did not reach step 2"; tail -c 600 "$tmp/log"; exit 1; }
rank1=""
for p in $(pgrep -f -- "$bin train --config $tmp/dp2.yaml"); do   # the ranks (mpirun's own line differs)
  [ "$p" = "$job" ] && continue
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then rank1=$p; fi
done
[ -n "$rank1" ] || { echo "FAIL: rank 1 not found"; exit 1; }
pids+=("$rank1")
kill -STOP "$rank1"
t0=$(date +%s)
for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
t1=$(date +%s)
if kill -0 "$job" 2>/dev/null; then echo "FAIL: the job still runs $((t1 - t0)) s after rank 1 stopped"; tail -c 600 "$tmp/log"; exit 1; fi
wait "$job"; rc=$?
fails=0
[ $rc -ne 0 ] || { echo "FAIL: the job exited 0"; fails=1; }
[ $((t1 - t0)) -le 30 ] || { echo "FAIL: the job took $((t1 - t0)) s to end (timeout 3 s)"; fails=1; }
grep -aqE 'llmkern: rank 0: [a-z_ ()-]+ \(step [0-9]+\) did not complete within 3 s \(train\.comm_timeout_s\)' "$tmp/log" \
  || { echo "FAIL: no watchdog message naming the collective, rank 0 and the step"; fails=1; }
tr '\r' '\n' <"$tmp/log" | grep -a 'did not complete' | head -2
echo "stop_rank: the job ended $((t1 - t0)) s after SIGSTOP of rank 1 (exit $rc)"
[ $fails -eq 0 ]

#!/usr/bin/env bash
# omp_wait.sh — OpenMP thread count x wait policy, idle and beside a competing process
# (issue 20, item 6; bench/NOTES.md "OpenMP under load"). Each cell trains the tiny MoE
# (1 layer, hidden 32, batch 2 x 32: a small-batch run whose barriers are frequent) for
# STEPS steps and reports tokens/s (the median of REPS runs) and the CPU seconds spent.
# The competitor is one busy loop (`while :; do :; done`), the usual case on a 2-core
# machine with another job on it. Policies: unset (nothing set: what the binary does on
# its own; libgomp's default before issue 20, the CLI's passive since), spin300k
# (GOMP_SPINCOUNT=300000: libgomp's default, spin 300k iterations before sleeping),
# active (OMP_WAIT_POLICY=active: spin without end), passive (sleep at once).
# Run: bash bench/omp_wait.sh build/llmkern [STEPS] [REPS]
set -u
bin=$1; steps=${2:-30}; reps=${3:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; [ -n "${hog:-}" ] && kill "$hog" 2>/dev/null' EXIT
cat >"$tmp/t.yaml" <<YAML
model: { hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16,
         intermediate_size: 64, vocab_size: 320, num_experts: 4, num_experts_per_tok: 2,
         moe_intermediate_size: 32, torch_dtype: float32 }
train: { steps: $steps, batch_size: 2, seq_len: 32, save_every: 0, warmup_steps: 1 }
data: { corpus: builtin, docs: 32 }
YAML
run() {   # run THREADS POLICY -> "tok/s cpu_s"
  local th=$1 pol=$2 env=(OMP_NUM_THREADS=$1)
  case $pol in active|passive) env+=(OMP_WAIT_POLICY=$pol) ;; spin300k) env+=(GOMP_SPINCOUNT=300000) ;; esac
  local r=()
  for _ in $(seq "$reps"); do
    local out; out=$( { /usr/bin/time -f 'cpu %U %S' env "${env[@]}" "$bin" train --config "$tmp/t.yaml" --out "$tmp/o" ; } 2>&1)
    local tps; tps=$(grep -o '[0-9.]* tokens/s' <<<"$out" | awk '{print $1}')
    local cpu; cpu=$(grep -o 'cpu [0-9.]* [0-9.]*' <<<"$out" | awk '{print $2 + $3}')
    r+=("$tps $cpu")
  done
  printf '%s\n' "${r[@]}" | sort -n | sed -n "$(( (reps + 1) / 2 ))p"
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $steps steps, median of $reps"
for load in idle busy; do
  hog=""
  if [ $load = busy ]; then bash -c 'while :; do :; done' & hog=$!; sleep 1; fi
  for th in 1 2; do
    for pol in unset spin300k active passive; do
      read -r tps cpu <<<"$(run $th $pol)"
      printf '%-5s threads %d  %-8s %9s tok/s  %6s cpu-s\n' $load $th $pol "$tps" "$cpu"
    done
  done
  [ -n "$hog" ] && kill "$hog" && wait "$hog" 2>/dev/null; hog=""
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

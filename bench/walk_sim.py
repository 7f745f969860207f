"""walk_sim.py — how many bytes fa3_bwd's causal walks bring from HBM when L2 is an LRU cache: the
SMs take the grid's blocks in launch order (grid_order.cuh's, one block a SM), every step of every
walk takes the same time, and a step touches its (q head, query tile): 16 KB of Q, 16 KB of dO and
the tile's 32 KB of f32 dQ sums, one 64 KB object, missed or hit as a whole. It ranks walk orders
before a device call; it does not time them (the step's cost does not depend on a hit, and L2's
capacity for one kernel is less than its 50 MB: `--l2`).
  python3 bench/walk_sim.py [--sms 132] [--l2 40] [--step-us 2.9] [--head-major]
--head-major: every grid head-major, as fa2.cu's causal dk/dv grids were until the forty-third
session (its tiles are fa3_bwd's: 128 keys a block, 64-row query steps).
Walks (fa3_bwd.cu's step_of; key block kt of a kv head sees query tiles [2 kt, nq) a head):
  heads  each head's tiles from the diagonal up, head by head (before the forty-second session)
  down   each tile's G heads in turn (from head kt % G), tiles from the last down, every block
  wave   as down for the first wave's blocks; a later block's tiles from its diagonal up
  main   fa3_bwd's rule: wave in a head-major grid, down in a banded one
Measured (H100, forty-second session, B 1, Hq 64, Hkv 8, S 4096 causal, fwd+bwd): heads 2.65-2.68
ms, down 2.19-2.20, wave 1.91-1.93 (the model: 73-85%, 30% and 9% of the steps missed).
The banded half of main's rule rests on this model alone so far."""
import argparse
import collections
import heapq

from grid_order_sim import block_of

OBJ = 64 << 10   # bytes a step touches: Q and dO tiles (bf16, 64 x 128 each) and the dQ tile's f32 sums


def walk(kind, G, nq, kt, down):
    """(head within the group, query tile) of each step of key block kt (128 keys: tiles 2 kt on);
    down: the block walks its tiles down (kinds wave and main)."""
    lo = 2 * kt
    n = nq - lo
    if kind == "heads" or G == 1:
        return [(it // n, lo + it % n) for it in range(G * n)]
    down = kind == "down" or down
    return [((it + kt) % G, nq - 1 - it // G if down else lo + it // G) for it in range(G * n)]


def simulate(kind, heads, nkt, G, nq, sms, l2_objs, fixed=2, head_major=False):
    """HBM objects missed over the grid, and the steps it ran: events in time order, the SMs
    taking blocks in launch order as they free up."""
    order = "bands" if heads * nkt >= 8 * sms and not head_major else "heads"   # grid_order.cuh, causal
    cache = collections.OrderedDict()
    misses = steps = 0
    ready = [(0, sm) for sm in range(sms)]   # (time the SM is free, sm)
    heapq.heapify(ready)
    running = []   # (time of its next step, sm, block index, walk, position)
    L = 0
    while L < heads * nkt or running:
        while L < heads * nkt and ready and (not running or ready[0][0] <= running[0][0]):
            t, sm = heapq.heappop(ready)
            hk, kt = block_of(order, heads, nkt, L)
            w = walk(kind, G, nq, kt, L < (heads * nkt if kind == "main" and order == "bands" else sms))
            heapq.heappush(running, (t + fixed, sm, L, hk, w, 0))
            L += 1
        t, sm, blk, hk, w, i = heapq.heappop(running)
        key = (hk * G + w[i][0], w[i][1])
        if key in cache:
            cache.move_to_end(key)
        else:
            misses += 1
            cache[key] = None
            if len(cache) > l2_objs:
                cache.popitem(last=False)
        steps += 1
        if i + 1 < len(w):
            heapq.heappush(running, (t + 1, sm, blk, hk, w, i + 1))
        else:
            heapq.heappush(ready, (t + 1, sm))
    return misses, steps


def main():
    P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    P.add_argument("--sms", type=int, default=132)
    P.add_argument("--l2", type=float, default=40, help="MB of L2 the walk's objects may hold")
    P.add_argument("--step-us", type=float, default=2.9, help="a step's time, for the HBM rate")
    P.add_argument("--head-major", action="store_true", help="every grid head-major (fa2's dk/dv)")
    A = P.parse_args()
    objs = int(A.l2 * 1e6 / OBJ)
    # (name, B * Hkv, key blocks, G, query tiles of 64 rows)
    cells = [("B2 H32 S8192", 64, 64, 1, 128), ("B1 Hq64 Hkv8 S4096 (GQA)", 8, 32, 8, 64),
             ("dense e2e B8 Hkv8 S4096 G2", 64, 32, 2, 64), ("MoE e2e B4 Hkv4 S4096 G4", 16, 32, 4, 64),
             ("B8 Hq32 Hkv8 S8192 G4", 64, 64, 4, 128)]
    print(f"L2 {A.l2:g} MB ({objs} objects of 64 KB), {A.sms} SMs, a step {A.step_us:g} us")
    for name, heads, nkt, G, nq in cells:
        for kind in ("heads", "down", "wave", "main"):
            if G == 1 and kind != "heads":
                continue
            misses, steps = simulate(kind, heads, nkt, G, nq, A.sms, objs, head_major=A.head_major)
            per_step = misses * OBJ / steps
            rate = per_step * A.sms / (A.step_us * 1e-6) / 1e12
            print(f"{name:28s} {kind:5s} misses {misses:7d} of {steps:7d} steps ({100 * misses / steps:5.1f}%), "
                  f"{per_step / 1024:5.1f} KB a step, {rate:4.2f} TB/s at full occupancy")


if __name__ == "__main__":
    main()

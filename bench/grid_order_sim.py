"""grid_order_sim.py — how long a causal attention grid takes in each of grid_order.cuh's orders when
the SMs take blocks in launch order (list scheduling), one block a SM, each block's time its walk's
length in steps (plus a fixed cost a block). No L2 in it: it shows only what an order loses at the
grid's end, which is why fa3_bwd takes bands only from 8 waves up (bench/NOTES.md, twenty-fifth
session: the GQA causal cell's 256 blocks ran 6% slower in bands; this gives +22%).
  python3 bench/grid_order_sim.py [--sms 132] [--fixed 2]"""
import argparse
import heapq


def block_of(order, heads, tiles, L):   # as grid_order.cuh decodes a block index
    if order == "heads":
        return L % heads, L // heads
    lo, w = 0, tiles
    if order == "bands":
        w = (tiles + 1) // 2
        while L >= heads * w:
            L, lo = L - heads * w, lo + w
            w = (tiles - lo + 1) // 2
    return L // w, lo + L % w


def makespan(order, heads, tiles, steps, sms, fixed):
    free = [0.0] * sms
    for L in range(heads * tiles):
        _, tile = block_of(order, heads, tiles, L)
        heapq.heappush(free, heapq.heappop(free) + steps(tile) + fixed)
    return max(free)


def main():
    P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    P.add_argument("--sms", type=int, default=132)
    P.add_argument("--fixed", type=float, default=2.0, help="a block's fixed cost, in steps")
    A = P.parse_args()
    # fa3_bwd: 128-key blocks, 64-row query tiles, G query heads a KV head: key block kt of nkt walks
    # G * 2 * (nkt - kt) steps under a causal mask (S_q = S_kv)
    cells = [("B2 H32 S8192", 64, 64, 1), ("B1 Hq64 Hkv8 S4096 (GQA)", 8, 32, 8),
             ("dense e2e B8 Hkv8 S4096 G2", 64, 32, 2), ("MoE e2e B4 Hkv4 S4096 G4", 16, 32, 4)]
    for name, heads, nkt, G in cells:
        steps = lambda kt: G * 2 * (nkt - kt)
        ideal = heads * sum(steps(k) + A.fixed for k in range(nkt)) / A.sms
        hm = makespan("heads", heads, nkt, steps, A.sms, A.fixed)
        bd = makespan("bands", heads, nkt, steps, A.sms, A.fixed)
        print(f"{name:28s} {heads * nkt:5d} blocks ({heads * nkt / A.sms:4.1f} waves): ideal {ideal:7.1f}, "
              f"head-major {hm:7.1f}, bands {bd:7.1f} ({bd / hm - 1:+.1%})")


if __name__ == "__main__":
    main()

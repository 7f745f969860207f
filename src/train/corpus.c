/* corpus.c — the embedded default corpus: documents generated from a small grammar with
 * the counter-based generator, so `make run` trains on a fresh machine with nothing
 * downloaded. Document i is a pure function of (seed, i). The structure is what a tiny
 * model can pick up within a hundred steps: a few hundred words in fixed templates,
 * facts that hold across documents (a person always lives in the same city), arithmetic
 * that is always right, records with a fixed key order, and counting patterns. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/checked.h"
#include "llmkern/data.h"
#include "llmkern/rng.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))
#define DOC_CAP 4096      /* longest target (3000) plus one unit, with room to spare */
#define MIN_LEN 24.0
#define MAX_LEN 3000.0

static const char *const nouns[] = {
    "cat", "dog", "bird", "fish", "horse", "tree", "river", "house", "garden", "road",
    "book", "letter", "table", "chair", "window", "door", "lamp", "cup", "plate", "apple",
    "bread", "cake", "stone", "hill", "cloud", "star", "moon", "boat", "train", "car",
    "bridge", "tower", "field", "forest", "flower", "song", "story", "box", "key", "ring",
    "clock", "coat", "hat", "shoe", "bell", "wall", "bag", "ship", "farm", "shop",
    "king", "queen", "child", "teacher", "farmer", "baker", "doctor", "sailor", "painter", "singer",
    "mouse", "lion", "bear", "wolf", "fox", "owl", "frog", "duck", "goat", "sheep",
};
static const char *const adjs[] = {
    "big", "small", "old", "young", "red", "blue", "green", "yellow", "white", "black",
    "happy", "sad", "quick", "slow", "quiet", "loud", "warm", "cold", "bright", "dark",
    "soft", "hard", "tall", "short", "clever", "kind", "brave", "lazy", "busy", "tired",
    "round", "square", "heavy", "light", "new", "strange", "gentle", "wild", "clean", "empty",
};
static const char *const verbs[] = {
    "saw", "found", "took", "moved", "painted", "carried", "watched", "followed", "cleaned", "opened",
    "closed", "lifted", "dropped", "wanted", "liked", "helped", "called", "visited", "built", "washed",
    "pushed", "pulled", "touched", "counted", "bought", "sold", "cooked", "broke", "fixed", "kept",
};
static const char *const names[] = {
    "alice", "bob", "carol", "dave", "emma", "frank", "grace", "henry", "iris", "jack",
    "kate", "leo", "mia", "noah", "olivia", "paul", "quinn", "rose", "sam", "tina",
    "uma", "victor", "wendy", "xavier", "yara", "zoe", "anna", "ben", "clara", "daniel",
};
static const char *const cities[] = {
    "paris", "london", "rome", "berlin", "madrid", "vienna", "oslo", "lisbon", "prague", "dublin",
    "athens", "warsaw", "tokyo", "cairo", "lima", "quito", "delhi", "seoul", "sydney", "toronto",
};
static const char *const places[] = {
    "market", "park", "school", "library", "station", "beach", "castle", "village", "kitchen", "harbor",
};
static const char *const jobs[] = {
    "teacher", "farmer", "baker", "doctor", "sailor", "painter", "singer", "writer", "builder", "cook",
};
static const char *const things[] = {  /* plurals for "has 4 cups" */
    "cups", "apples", "books", "boats", "stones", "keys", "rings", "hats", "bells", "bags",
    "coats", "shoes", "lamps", "plates", "cakes", "boxes", "letters", "flowers", "chairs", "clocks",
};
static const char *const colors[] = {"red", "blue", "green", "yellow", "white", "black", "orange", "purple"};

/* Facts that hold in every document, so they are worth learning. */
static const char *city_of(int name) { return cities[(name * 7 + 3) % COUNT(cities)]; }
static const char *job_of(int name) { return jobs[(name * 3 + 1) % COUNT(jobs)]; }
static int age_of(int name) { return 18 + (name * 13) % 60; }

typedef struct {
    uint64_t seed, counter;
    char buf[DOC_CAP];
    size_t n;
} gen;

static uint64_t draw(gen *g) { return lk_rng_bits(g->seed, g->counter++); }
static int pick(gen *g, int n) { return (int)(draw(g) % (uint64_t)n); }
#define WORD(g, list) (list)[pick((g), COUNT(list))]

static void put(gen *g, const char *fmt, ...) {
    if (g->n >= DOC_CAP - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(g->buf + g->n, DOC_CAP - g->n, fmt, ap);
    va_end(ap);
    if (k > 0) g->n += (size_t)k < DOC_CAP - 1 - g->n ? (size_t)k : DOC_CAP - 1 - g->n;
}

static void sentence(gen *g) {
    int a = pick(g, COUNT(names)), b = pick(g, COUNT(names));
    switch (pick(g, 8)) {
    case 0: put(g, "the %s %s %s the %s %s.", WORD(g, adjs), WORD(g, nouns), WORD(g, verbs), WORD(g, adjs), WORD(g, nouns)); break;
    case 1: put(g, "%s lives in %s.", names[a], city_of(a)); break;
    case 2: put(g, "%s is a %s.", names[a], job_of(a)); break;
    case 3: put(g, "%s and %s went to the %s.", names[a], names[b], WORD(g, places)); break;
    case 4: put(g, "the %s is %s.", WORD(g, nouns), WORD(g, adjs)); break;
    case 5: put(g, "%s %s a %s %s in the %s.", names[a], WORD(g, verbs), WORD(g, colors), WORD(g, nouns), WORD(g, places)); break;
    case 6: put(g, "when the %s %s the %s, %s was %s.", WORD(g, nouns), WORD(g, verbs), WORD(g, nouns), names[a], WORD(g, adjs)); break;
    default: put(g, "%s has %d %s.", names[a], 2 + pick(g, 9), WORD(g, things)); break;
    }
}

static void story_unit(gen *g) {
    int k = 2 + pick(g, 4);
    for (int i = 0; i < k; i++) { sentence(g); put(g, i + 1 < k ? " " : "\n"); }
}

static void arithmetic_unit(gen *g) {
    int a, b;
    switch (pick(g, 3)) {
    case 0: a = pick(g, 100); b = pick(g, 100); put(g, "%d + %d = %d\n", a, b, a + b); break;
    case 1: a = pick(g, 100); b = pick(g, a + 1); put(g, "%d - %d = %d\n", a, b, a - b); break;
    default: a = pick(g, 13); b = pick(g, 13); put(g, "%d * %d = %d\n", a, b, a * b); break;
    }
}

static void record_unit(gen *g) {
    int p = pick(g, COUNT(names));
    put(g, "name: %s\nage: %d\ncity: %s\njob: %s\ncolor: %s\n\n", names[p], age_of(p), city_of(p),
        job_of(p), colors[(p * 5) % COUNT(colors)]);
}

static void pattern_unit(gen *g) {
    int start = pick(g, 50), len = 5 + pick(g, 12);
    switch (pick(g, 4)) {
    case 0: for (int i = 0; i < len; i++) put(g, "%d ", start + i); break;
    case 1: for (int i = len; i > 0; i--) put(g, "%d ", i); break;
    case 2: for (int i = 0; i < len; i++) put(g, "%c ", 'a' + (start + i) % 26); break;
    default: { const char *w = WORD(g, nouns); for (int i = 0; i < len; i++) put(g, "%s ", w); } break;
    }
    put(g, "\n");
}

static void generate(uint64_t seed, int64_t index, gen *g) {
    g->seed = seed;
    /* 2^24 draws per document (a long one takes a few thousand): documents never share counters */
    g->counter = (uint64_t)index << 24;
    g->n = 0;
    double u = (double)(draw(g) >> 11) * 0x1.0p-53;
    size_t target = (size_t)(MIN_LEN * exp(u * log(MAX_LEN / MIN_LEN)));  /* log-uniform */
    int kind = pick(g, 4);
    static const char *const titles[] = {"story", "sums", "records", "patterns"};
    if (pick(g, 2)) put(g, "# %s %lld\n", titles[kind], (long long)index);
    while (g->n < target && g->n < DOC_CAP - 512) {
        switch (kind) {
        case 0: story_unit(g); break;
        case 1: arithmetic_unit(g); break;
        case 2: record_unit(g); break;
        default: pattern_unit(g); break;
        }
    }
}

lk_status lk_corpus_document(uint64_t seed, int64_t index, char *buf, size_t cap, size_t *len) {
    if (index < 0) return lk_error(LK_EINVAL, "corpus: index: expected >= 0, got %lld", (long long)index);
    if (!buf && cap) return lk_error(LK_EINVAL, "corpus: buf: NULL with cap %zu", cap);
    gen *g = malloc(sizeof *g);
    if (!g) return lk_error(LK_ENOMEM, "corpus: out of memory");
    generate(seed, index, g);
    if (cap) {
        size_t k = g->n < cap - 1 ? g->n : cap - 1;
        memcpy(buf, g->buf, k);
        buf[k] = '\0';
    }
    if (len) *len = g->n;
    free(g);
    return LK_OK;
}

lk_status lk_corpus_generate(uint64_t seed, int64_t n_docs, lk_dataset *out) {
    memset(out, 0, sizeof *out);
    if (n_docs < 1 || n_docs > ((int64_t)1 << 36))
        return lk_error(LK_EINVAL, "corpus: n_docs: expected 1..2^36, got %lld", (long long)n_docs);
    /* the mean document is ~700 bytes: ~800 tokens each is what the buffers start with */
    int64_t cap64;
    size_t tok_bytes, start_bytes;
    char what[96];
    lk_status s;
    if ((s = lk_checked_mul("corpus: data.docs", n_docs, 800, &cap64)) ||
        (s = lk_checked_bytes("corpus: data.docs (tokens)", cap64, sizeof *out->tokens, &tok_bytes)) ||
        (s = lk_checked_bytes("corpus: data.docs (offsets)", n_docs + 1, sizeof *out->doc_start, &start_bytes)))
        return s;
    snprintf(what, sizeof what, "corpus: data.docs %lld (about %lld tokens)", (long long)n_docs, (long long)cap64);
    if ((s = lk_check_fits_memory(what, (uint64_t)tok_bytes + start_bytes))) return s;
    size_t cap = (size_t)cap64;
    gen *g = malloc(sizeof *g);
    out->tokens = malloc(tok_bytes);
    out->doc_start = malloc(start_bytes);
    if (!g || !out->tokens || !out->doc_start) goto oom;
    int64_t n = 0;
    out->doc_start[0] = 0;
    for (int64_t d = 0; d < n_docs; d++) {
        generate(seed, d, g);
        if ((size_t)n + g->n + 2 > cap) {
            cap = 2 * cap + g->n + 2;
            int32_t *t = realloc(out->tokens, cap * sizeof *t);
            if (!t) goto oom;
            out->tokens = t;
        }
        n += lk_tok_encode(g->buf, g->n, 1, out->tokens + n);
        out->doc_start[d + 1] = n;
    }
    free(g);
    out->n_tokens = n;
    out->n_docs = n_docs;
    out->vocab = LK_TOK_VOCAB;
    return LK_OK;
oom:
    free(g);
    lk_dataset_free(out);
    return lk_error(LK_ENOMEM, "corpus: out of memory for %lld documents", (long long)n_docs);
}

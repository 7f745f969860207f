/* test_tokenize.c — scripts/tokenize.py (issue 22, item 4) end to end, nothing downloaded
 * but the `tokenizers` wheel the script installs into its venv when it is missing: the
 * embedded corpus written as a text file and as JSONL, a small byte-level BPE trained on
 * it with `tokenizers` (--train-bpe), both inputs tokenized into LKTOK version-2 files
 * (the same bytes), read back with the header's EOS id and vocabulary, and a short
 * `llmkern train` on the output whose loss falls; a model vocabulary below the ids is
 * refused with both numbers; the script's bad inputs exit 2 naming the file and line.
 * Needs python3 (and python3-venv where `tokenizers` is absent: scripts/install-deps.sh).
 * The llmkern binary is the one beside this test's. Run: ctest -R test_tokenize. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "llmkern/llmkern.h"
#include "llmkern/data.h"
#include "train_util.h"

enum { DOCS = 96, VOCAB = 384 };
static char *dir;
static char src[512], bin[600], out_path[700];
static int64_t corpus_bytes;

/* Runs cmd (a shell line) with its output in out_path; returns the exit status. */
static int run(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && n < (int)sizeof cmd - 80);
    snprintf(cmd + n, sizeof cmd - n, " >'%s' 2>&1", out_path);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static char *output(void) {
    size_t n;
    char *t = (char *)slurp(out_path, &n);
    assert_non_null(t);
    return t;
}

static void expect_output(const char *want) {
    char *t = output();
    if (!strstr(t, want)) print_error("expected '%s' in:\n%s\n", want, t);
    assert_non_null(strstr(t, want));
    free(t);
}

static void path(char *buf, size_t n, const char *file) { snprintf(buf, n, "%s/%s", dir, file); }

static void write_file(const char *file, const char *text) {
    char p[700];
    path(p, sizeof p, file);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The corpus's first DOCS documents: blank-line separated text, and one JSON object a line. */
static int setup(void **state) {
    (void)state;
    dir = tmpdir();
    const char *s = getenv("LLMKERN_SOURCE_DIR");
    snprintf(src, sizeof src, "%s", s ? s : ".");
    char exe[512];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(k > 0);
    exe[k] = 0;
    snprintf(bin, sizeof bin, "%s/llmkern", dirname(exe));
    path(out_path, sizeof out_path, "output.txt");
    char p[700], q[700];
    path(p, sizeof p, "corpus.txt");
    path(q, sizeof q, "corpus.jsonl");
    FILE *t = fopen(p, "w"), *j = fopen(q, "w");
    assert_true(t && j);
    static char doc[1 << 16];
    for (int64_t i = 0; i < DOCS; i++) {
        size_t len;
        assert_int_equal(lk_corpus_document(1234, i, doc, sizeof doc, &len), LK_OK);
        assert_true(len < sizeof doc);
        for (char *b; (b = strstr(doc, "\n\n")) != NULL; len--)   /* one blank-line separated block */
            memmove(b, b + 1, strlen(b + 1) + 1);
        while (len && (doc[len - 1] == '\n' || doc[len - 1] == ' ')) doc[--len] = 0;
        fprintf(t, "%s\n\n", doc);
        fputs("{\"text\": \"", j);   /* the same text, "...\n" as the text file's reader keeps it */
        for (size_t c = 0; c < len; c++) {
            unsigned char ch = (unsigned char)doc[c];
            if (ch == '"' || ch == '\\') fprintf(j, "\\%c", ch);
            else if (ch < 0x20) fprintf(j, "\\u%04x", ch);
            else fputc(ch, j);
        }
        fputs("\\n\"}\n", j);
        corpus_bytes += (int64_t)len + 1;
    }
    fclose(t);
    fclose(j);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rm_rf(dir);
    return 0;
}

static void bpe_tokenize_and_train(void **state) {
    (void)state;
    int rc = run("cd '%s' && python3 '%s/scripts/tokenize.py' --train-bpe %d --tokenizer tok.json --out corpus.lktok "
                 "corpus.txt", dir, src, VOCAB);
    if (rc) { char *t = output(); print_error("%s\n", t); free(t); }
    assert_int_equal(rc, 0);
    expect_output("corpus.lktok: ");
    expect_output("uint16, vocabulary 384, eos 0 ('<|endoftext|>')");
    /* the header's EOS splits the documents; the BPE compresses the bytes */
    char p[700], q[700];
    path(p, sizeof p, "corpus.lktok");
    lk_dataset ds;
    assert_int_equal(lk_dataset_load_tokens(p, VOCAB, LK_EOS_FROM_FILE, &ds), LK_OK);
    assert_int_equal(ds.n_docs, DOCS);
    for (int64_t d = 0; d < DOCS; d++) assert_int_equal(ds.tokens[ds.doc_start[d + 1] - 1], 0);
    print_message("%d documents, %lld bytes -> %lld BPE tokens of %d ids\n", DOCS, (long long)corpus_bytes,
                  (long long)ds.n_tokens, VOCAB);
    assert_true(ds.n_tokens < corpus_bytes * 7 / 10);
    /* the model's vocabulary below the ids: the id, model.vocab_size and the tokenizer's */
    lk_dataset none;
    assert_int_equal(lk_dataset_load_tokens(p, 300, LK_EOS_FROM_FILE, &none), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "model.vocab_size 300"));
    assert_non_null(strstr(lk_last_error(), "the file's tokenizer has 384 ids"));
    /* the JSONL of the same documents gives the same file, byte for byte */
    assert_int_equal(run("cd '%s' && python3 '%s/scripts/tokenize.py' --tokenizer tok.json --out jsonl.lktok "
                         "corpus.jsonl", dir, src), 0);
    path(q, sizeof q, "jsonl.lktok");
    size_t na, nb;
    uint8_t *a = slurp(p, &na), *b = slurp(q, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    lk_dataset_free(&ds);

    /* a short `llmkern train` on it: the loss falls from about ln(384) */
    write_file("train.yaml",
               "model: { hidden_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1,\n"
               "         head_dim: 32, intermediate_size: 128, vocab_size: 384, torch_dtype: float32 }\n"
               "train: { steps: 40, lr: 1e-2, min_lr: 1e-3, warmup_steps: 4, batch_size: 4, seq_len: 64 }\n"
               "data: { tokens: corpus.lktok }\n");
    rc = run("cd '%s' && OMP_NUM_THREADS=2 '%s' train --config train.yaml --out run", dir, bin);
    if (rc) { char *t = output(); print_error("%s\n", t); free(t); }
    assert_int_equal(rc, 0);
    path(p, sizeof p, "run/loss.csv");
    char *csv = (char *)slurp(p, &na), *save, *line = strtok_r(csv, "\n", &save);
    double first = NAN, last = NAN;
    int rows = 0;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        double l;
        assert_int_equal(sscanf(line, "%*d,%lf", &l), 1);
        if (rows++ == 0) first = l;
        last = l;
    }
    free(csv);
    print_message("llmkern train on the BPE tokens: loss %.3f -> %.3f in %d steps (ln 384 = %.3f)\n", first, last,
                  rows, log(384.0));
    assert_int_equal(rows, 40);
    assert_true(fabs(first - log(384.0)) < 0.5);
    assert_true(last < first - 1.0);
    /* the same config with a vocabulary below the tokenizer's: refused, both numbers named */
    write_file("small.yaml",
               "model: { hidden_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1,\n"
               "         head_dim: 32, intermediate_size: 128, vocab_size: 320, torch_dtype: float32 }\n"
               "train: { steps: 2, batch_size: 4, seq_len: 64 }\ndata: { tokens: corpus.lktok }\n");
    assert_int_equal(run("cd '%s' && '%s' train --config small.yaml --out small", dir, bin), 2);
    expect_output("beyond the model's vocabulary (model.vocab_size 320: every id must be below it; the file's "
                  "tokenizer has 384 ids)");
    path(p, sizeof p, "small");
    assert_int_equal(access(p, F_OK), -1);
}

static void bad_inputs(void **state) {
    (void)state;
    write_file("nokey.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n");
    write_file("notjson.jsonl", "{\"text\": \"fine\"}\n\n{\"text\": oops}\n");
    write_file("empty.txt", "\n  \n\n");
    write_file("bad.json.tok", "{ not a tokenizer");
    struct { const char *args, *want; } cases[] = {
        {"--tokenizer tok.json --out x.lktok missing.txt", "missing.txt: cannot read"},
        {"--tokenizer tok.json --out x.lktok nokey.jsonl", "nokey.jsonl:2: expected an object with a \"text\" field"},
        {"--tokenizer tok.json --out x.lktok notjson.jsonl", "notjson.jsonl:3: not a JSON object"},
        {"--tokenizer tok.json --out x.lktok empty.txt", "empty.txt: no document"},
        {"--tokenizer bad.json.tok --out x.lktok corpus.txt", "--tokenizer bad.json.tok: cannot load"},
        {"--tokenizer tok.json --out x.lktok --eos-token '<nope>' corpus.txt", "--eos-token: '<nope>' is not in tok.json"},
        {"--tokenizer tok.json --out x.lktok --eos-id 384 corpus.txt", "--eos-id: expected 0..383"},
        {"--tokenizer tok.json --out x.lktok --eos-id 1 --eos-token '<|endoftext|>' corpus.txt", "got both"},
        {"--tokenizer t2.json --out x.lktok --train-bpe 100 corpus.txt", "--train-bpe: expected 257.."},
        {"--tokenizer tok.json --out no/such/dir/x.lktok corpus.txt", "no/such/dir/x.lktok: cannot write"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int rc = run("cd '%s' && python3 '%s/scripts/tokenize.py' %s", dir, src, cases[k].args);
        if (rc != 2) { char *t = output(); print_error("%s: exit %d\n%s\n", cases[k].args, rc, t); free(t); }
        assert_int_equal(rc, 2);
        expect_output(cases[k].want);
    }
    char p[700];
    path(p, sizeof p, "x.lktok");
    assert_int_equal(access(p, F_OK), -1);   /* nothing written by a refusal */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bpe_tokenize_and_train),
        cmocka_unit_test(bad_inputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* train_state.c — the trainer's checkpoints (internal to src/train, see trainer.h):
 * out/checkpoint-<step>/ holds config.json + model.safetensors (lk_model_save_sharded, the
 * published format: sharded with an index past train.max_shard_size) and optimizer.safetensors
 * (f32 master weights, AdamW m and v in their dtypes, the step, the data iterator's state,
 * the seed and the loss history), every file written atomically into a .tmp directory
 * renamed into place; then out/latest is replaced atomically by the directory's name. A
 * write that fails leaves latest naming the previous complete checkpoint, untouched. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "llmkern/checkpoint.h"
#include "llmkern/hf_config.h"
#include "model/device.h"
#include "train/trainer.h"

lk_status lk_mkdirs(const char *path) {
    char p[1024];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return lk_error(LK_EINVAL, "train: path too long: %s", path);
    for (char *c = p + 1; ; c++) {
        if (*c != '/' && *c != '\0') continue;
        char keep = *c;
        *c = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return lk_error(LK_EIO, "train: %s: cannot create directory: %s", p, strerror(errno));
        *c = keep;
        if (keep == '\0') return LK_OK;
    }
}

/* Names of the optimizer file's tensors: "<kind>/<param name>". */
static void key(char *buf, size_t n, const char *kind, const char *name) { snprintf(buf, n, "%s/%s", kind, name); }

/* One tensor of the optimizer file; a GPU's through a host copy the writer keeps. */
static lk_status add_tensor(lk_st_writer *w, trainer *t, const char *kind, const char *name, lk_tensor x) {
    char k[200];
    key(k, sizeof k, kind, name);
    if (x.device.type == LK_DEVICE_CPU) return lk_st_writer_add(w, k, &x);
    size_t bytes = lk_tensor_bytes(&x);
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return lk_error(LK_ENOMEM, "train: checkpoint: %s: out of memory", k);
    lk_status s = lk_model_device_of(t->model)->get(h, x.data, bytes);
    x.data = h, x.device = (lk_device){LK_DEVICE_CPU, 0};
    if (!s) s = lk_st_writer_add_as(w, k, &x, x.dtype);   /* a copy of its own */
    free(h);
    return s;
}

/* One tensor of the optimizer file into x; a GPU's through a host copy. */
static lk_status read_tensor(trainer *t, lk_st_file *f, const char *kind, const char *name, lk_tensor x) {
    char k[200];
    key(k, sizeof k, kind, name);
    if (x.device.type == LK_DEVICE_CPU) return lk_st_read(f, k, &x);
    size_t bytes = lk_tensor_bytes(&x);
    void *dst = x.data, *h = malloc(bytes ? bytes : 1);
    if (!h) return lk_error(LK_ENOMEM, "train: resume: %s: out of memory", k);
    x.data = h, x.device = (lk_device){LK_DEVICE_CPU, 0};
    lk_status s = lk_st_read(f, k, &x);
    if (!s) s = lk_model_device_of(t->model)->put(dst, h, bytes);
    free(h);
    return s;
}

/* Parameter i's tensors in the optimizer file (its value, exp_avg and exp_avg_sq), each
 * added to w, or, when w is NULL, read from f. */
static lk_status param_state(trainer *t, int i, lk_st_writer *w, lk_st_file *f) {
    static const char *const kinds[3] = {"param", "exp_avg", "exp_avg_sq"};
    lk_param *p = lk_model_param(t->model, i);
    lk_tensor x[3] = {p->value, p->value, p->value};
    x[1].data = t->m[i], x[1].dtype = t->tc->exp_avg_dtype;
    x[2].data = t->v[i], x[2].dtype = t->tc->exp_avg_sq_dtype;   /* a resume converts another dtype's */
    lk_status s = LK_OK;
    for (int k = 0; k < 3 && !s; k++)
        s = w ? add_tensor(w, t, kinds[k], p->name, x[k]) : read_tensor(t, f, kinds[k], p->name, x[k]);
    return s;
}

static lk_status write_optimizer(trainer *t, const char *path) {
    lk_data_state ds = lk_data_iter_state(&t->it);
    int64_t scalars[7] = {t->step, (int64_t)ds.seed, ds.epoch, ds.cursor, ds.offset, ds.step, (int64_t)t->tc->seed};
    int64_t hist_shape[2] = {t->step, LK_HIST_COLS};
    lk_tensor st = lk_tensor_1d(scalars, LK_I64, 7);
    lk_tensor hist = lk_tensor_view(t->hist, LK_F32, 2, hist_shape);
    lk_st_writer *w;
    lk_status s = lk_st_writer_begin(path, &w);
    if (s) return s;
    for (int i = 0; !s && i < t->n_params; i++) s = param_state(t, i, w, NULL);
    if (!s) s = lk_st_writer_add(w, "trainer/state", &st);
    if (!s) s = lk_st_writer_add(w, "trainer/history", &hist);
    if (!s) s = lk_st_writer_set_metadata(w, "format", "llmkern-adamw");
    if (s) { lk_st_writer_abort(w); return s; }
    return lk_st_writer_commit(w);
}

/* Removes dir and the files in it (a checkpoint holds no subdirectories); absent is fine. */
static lk_status remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return errno == ENOENT ? LK_OK : lk_error(LK_EIO, "train: %s: %s", dir, strerror(errno));
    char p[1300];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    return rmdir(dir) == 0 ? LK_OK : lk_error(LK_EIO, "train: %s: cannot remove: %s", dir, strerror(errno));
}

static lk_status fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) {
        if (fd >= 0) close(fd);
        return lk_error(LK_EIO, "train: %s: fsync: %s", dir, strerror(errno));
    }
    close(fd);
    return LK_OK;
}

/* The checkpoint is written whole into checkpoint-<step>.tmp/ and renamed into place,
 * so the directory `latest` names is never partly overwritten: a run that saves a step
 * an earlier run saved too moves the old one aside (.old) until latest is updated. */
static lk_status save_files(trainer *t, const char *name) {
    char dir[1100], tmp[1110], old[1110], path[1200];
    snprintf(dir, sizeof dir, "%s/%s", t->tc->out, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    snprintf(old, sizeof old, "%s.old", dir);
    lk_status s = remove_dir(tmp);
    if (!s) s = lk_mkdirs(tmp);
    if (!s) s = lk_model_save_sharded(t->model, tmp, t->tc->max_shard_size);
    if (!s) { snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp); s = write_optimizer(t, path); }
    if (!s) s = remove_dir(old);
    if (!s && rename(dir, old) != 0 && errno != ENOENT) s = lk_error(LK_EIO, "train: %s: %s", dir, strerror(errno));
    if (!s && rename(tmp, dir) != 0) s = lk_error(LK_EIO, "train: %s: %s", tmp, strerror(errno));
    if (!s) s = fsync_dir(t->tc->out);
    if (!s) {
        char text[80];
        int n = snprintf(text, sizeof text, "%s\n", name);
        snprintf(path, sizeof path, "%s/latest", t->tc->out);
        s = lk_write_file_atomic(path, text, (size_t)n);
    }
    if (!s) s = remove_dir(old);
    if (!s) snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", dir);
    return s;
}

lk_status lk_trainer_save(trainer *t) {
    char name[64];
    snprintf(name, sizeof name, "checkpoint-%lld", (long long)t->step);
    lk_status s = save_files(t, name);
    if (s) {
        char why[512];
        snprintf(why, sizeof why, "%s", lk_last_error());   /* lk_error rewrites that buffer */
        return lk_error(s, "train: checkpoint at step %lld not written (%s); %s%s", (long long)t->step, why,
                        t->last_ckpt[0] ? "the last good one is " : "no checkpoint yet", t->last_ckpt);
    }
    return LK_OK;
}

/* A checkpoint directory, or an output directory whose `latest` names one. What is
 * neither, or a `latest` naming a checkpoint that is gone, is refused by name. */
static lk_status resolve(const char *resume, char *dir, size_t n) {
    char path[1100], name[256] = "";
    struct stat st;
    snprintf(path, sizeof path, "%s/latest", resume);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(path, sizeof path, "%s/optimizer.safetensors", resume);
        if (stat(resume, &st) != 0 || !S_ISDIR(st.st_mode))
            return lk_error(LK_EIO, "train: --resume %s: no such directory", resume);
        if (stat(path, &st) != 0)
            return lk_error(LK_EIO, "train: --resume %s: no checkpoint there (neither a 'latest' file nor "
                            "optimizer.safetensors: a run saves one every train.save_every steps and at the end)",
                            resume);
        snprintf(dir, n, "%s", resume);
        return LK_OK;
    }
    size_t got = fread(name, 1, sizeof name - 1, f);
    fclose(f);
    name[got] = '\0';
    name[strcspn(name, "\r\n")] = '\0';
    if (name[0] == '\0' || strchr(name, '/') || strcmp(name, "..") == 0 || strcmp(name, ".") == 0)
        return lk_error(LK_EIO, "train: --resume %s: %s: expected a checkpoint name, got '%s'", resume, path, name);
    snprintf(dir, n, "%s/%s", resume, name);
    if (stat(dir, &st) == 0) return LK_OK;
    snprintf(dir, n, "%s/%s.old", resume, name);   /* a crash between the renames */
    if (stat(dir, &st) == 0) return LK_OK;
    return lk_error(LK_EIO, "train: --resume %s: %s names %s, which does not exist in %s", resume, path, name, resume);
}

/* --- verifying a checkpoint before anything is read from it ---------------------------- */

/* The sizes of config.json that decide the tensors' shapes, against the run's model. */
static lk_status check_config_json(const trainer *t, const char *path) {
    static lk_qwen3_config c;   /* large (its lists): not on the stack; the trainer runs on one thread */
    lk_status s = lk_qwen3_config_read(path, &c);
    if (s) return s;
    const lk_qwen3_config *m = &t->tc->model;
    static const struct { const char *name; size_t off; int moe; } keys[] = {
#define K(f, moe) {#f, offsetof(lk_qwen3_config, f), moe}
        K(hidden_size, 0), K(num_hidden_layers, 0), K(num_attention_heads, 0), K(num_key_value_heads, 0),
        K(head_dim, 0), K(intermediate_size, 0), K(vocab_size, 0), K(num_experts, 1), K(num_experts_per_tok, 1),
        K(moe_intermediate_size, 1), K(decoder_sparse_step, 1),
#undef K
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        int64_t a = *(const int64_t *)((const char *)&c + keys[i].off), b = *(const int64_t *)((const char *)m + keys[i].off);
        if ((keys[i].moe && !m->moe) || a == b) continue;
        return lk_error(LK_EINVAL, "%s: %s is %lld, the run's model has %lld", path, keys[i].name, (long long)a,
                        (long long)b);
    }
    if (c.tie_word_embeddings != m->tie_word_embeddings || c.moe != m->moe)
        return lk_error(LK_EINVAL, "%s: %s differs from the run's model", path,
                        c.moe != m->moe ? "the family (num_experts)" : "tie_word_embeddings");
    return LK_OK;
}

/* f holds exactly the model's parameters (under each prefix) with their shapes, and
 * `extra` more tensors; each of a float dtype (converted as it is read: an f32 master from
 * bf16 values exactly, bf16 ones from f32 to nearest even). */
static lk_status check_tensors(trainer *t, const lk_st_file *f, const char *path, const char *const *prefixes,
                               int n_prefixes, size_t extra) {
    for (int k = 0; k < n_prefixes; k++) {
        for (int i = 0; i < t->n_params; i++) {
            const lk_param *p = lk_model_param(t->model, i);
            char name[200], want[64];
            snprintf(name, sizeof name, "%s%s", prefixes[k], p->name);
            const lk_st_tensor *x = lk_st_find(f, name);
            if (!x) return lk_error(LK_EIO, "%s: no tensor '%s'", path, name);
            int same = x->ndim == p->value.ndim;
            for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == p->value.shape[d];
            if (!same)
                return lk_error(LK_ESHAPE, "%s: '%s': expected shape %s, the file's has %d dimensions [%lld%s]", path, name,
                                lk_shape_str(&p->value, want, sizeof want), x->ndim,
                                (long long)(x->ndim ? x->shape[0] : 0), x->ndim > 1 ? ", ..." : "");
            if (x->dtype != LK_F32 && x->dtype != LK_BF16 && x->dtype != LK_F16)
                return lk_error(LK_EDTYPE, "%s: '%s': expected F32, BF16 or F16, got %s", path, name, x->st_dtype);
        }
    }
    size_t want_n = (size_t)n_prefixes * (size_t)t->n_params + extra;
    if (lk_st_count(f) != want_n)
        return lk_error(LK_EIO, "%s: %zu tensors, expected %zu (the model's %d parameters%s)", path, lk_st_count(f),
                        want_n, t->n_params, extra ? " and the trainer's state" : "");
    return LK_OK;
}

/* Every file of the checkpoint in dir, before any step: config.json against the model,
 * the published weights (single or sharded; not read to resume, but handed on as the
 * checkpoint) and optimizer.safetensors opened (header, sizes, spans) and their tensors'
 * names and shapes checked. The error names the damaged file. */
static lk_status verify_checkpoint(trainer *t, const char *dir) {
    char path[1200];
    lk_st_file *f = NULL;
    lk_status s;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((s = check_config_json(t, path))) return s;
    static const char *const opt[] = {"param/", "exp_avg/", "exp_avg_sq/"};
    if ((s = lk_model_check_weights(t->model, dir))) return s;   /* single or sharded */
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if ((s = lk_st_open(path, &f))) return s;
    s = check_tensors(t, f, path, opt, 3, 2);   /* the weights and moments converted as read */
    const lk_st_tensor *st = lk_st_find(f, "trainer/state");
    if (!s && (st == NULL || st->dtype != LK_I64 || st->ndim != 1 || st->shape[0] != 7))
        s = lk_error(LK_EIO, "%s: trainer/state: expected I64 [7]", path);
    lk_st_close(f);
    return s;
}

static lk_status resume_error(lk_status s, const char *resume) {
    char why[512];
    snprintf(why, sizeof why, "%s", lk_last_error());
    return lk_error(s, "train: --resume %s: %s", resume, why);
}

lk_status lk_trainer_resume(trainer *t, const char *resume) {
    char dir[1100], path[1200];
    lk_status s = resolve(resume, dir, sizeof dir);
    if (s) return s;
    if ((s = verify_checkpoint(t, dir))) return resume_error(s, resume);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    lk_st_file *f;
    if ((s = lk_st_open(path, &f))) return resume_error(s, resume);
    int64_t sc[7];
    const lk_st_tensor *h = lk_st_find(f, "trainer/history");
    lk_tensor st = lk_tensor_1d(sc, LK_I64, 7);
    s = lk_st_read(f, "trainer/state", &st);
    if (!s && (h == NULL || h->ndim != 2 || h->shape[0] != sc[0] || h->shape[1] != LK_HIST_COLS))
        s = lk_error(LK_EIO, "%s: trainer/history: expected [%lld, %d]", path, (long long)sc[0], LK_HIST_COLS);
    if (!s && (sc[0] < 1 || sc[0] > t->tc->steps))
        s = lk_error(LK_EINVAL, "%s: step %lld: expected 1..%lld (train.steps)", path, (long long)sc[0],
                     (long long)t->tc->steps);
    if (!s && (uint64_t)sc[6] != t->tc->seed)
        s = lk_error(LK_EINVAL, "%s: seed %lld: expected the config's %llu", path, (long long)sc[6],
                     (unsigned long long)t->tc->seed);
    for (int i = 0; !s && i < t->n_params; i++) s = param_state(t, i, NULL, f);
    if (!s) {
        int64_t hs[2] = {sc[0], LK_HIST_COLS};
        lk_tensor ht = lk_tensor_view(t->hist, LK_F32, 2, hs);
        s = lk_st_read(f, "trainer/history", &ht);
    }
    if (!s) {
        lk_data_state ds = {.seed = (uint64_t)sc[1], .epoch = sc[2], .cursor = sc[3], .offset = sc[4], .step = sc[5]};
        s = lk_data_iter_restore(&t->it, &ds);
    }
    lk_st_close(f);
    if (s) return resume_error(s, resume);
    t->step = t->start_step = sc[0];
    snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", dir);
    return LK_OK;
}

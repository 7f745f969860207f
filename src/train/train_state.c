/* train_state.c — the trainer's checkpoints (internal to src/train, see trainer.h):
 * out/checkpoint-<step>/ holds config.json + model.safetensors (lk_model_save, the
 * published format) and optimizer.safetensors (f32 master weights, AdamW m and v, the
 * step, the data iterator's state, the seed and the loss history), every file written
 * atomically into a .tmp directory renamed into place; then out/latest is replaced
 * atomically by the directory's name. A write that fails leaves latest naming the
 * previous complete checkpoint, untouched. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "llmkern/checkpoint.h"
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

static lk_status add_param_state(lk_st_writer *w, trainer *t, int i) {
    lk_param *p = lk_model_param(t->model, i);
    lk_tensor m = p->value, v = p->value;
    m.data = t->m[i];
    v.data = t->v[i];
    lk_status s;
    if ((s = add_tensor(w, t, "param", p->name, p->value)) || (s = add_tensor(w, t, "exp_avg", p->name, m))) return s;
    return add_tensor(w, t, "exp_avg_sq", p->name, v);
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
    for (int i = 0; !s && i < t->n_params; i++) s = add_param_state(w, t, i);
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
    if (!s) s = lk_model_save(t->model, tmp);
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

/* A checkpoint directory, or an output directory whose `latest` names one. */
static lk_status resolve(const char *resume, char *dir, size_t n) {
    char path[1100], name[256] = "";
    snprintf(path, sizeof path, "%s/latest", resume);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(dir, n, "%s", resume);
        return LK_OK;
    }
    size_t got = fread(name, 1, sizeof name - 1, f);
    fclose(f);
    name[got] = '\0';
    name[strcspn(name, "\r\n")] = '\0';
    if (name[0] == '\0' || strchr(name, '/')) return lk_error(LK_EIO, "train: %s: expected a checkpoint name", path);
    snprintf(dir, n, "%s/%s", resume, name);
    struct stat st;
    if (stat(dir, &st) != 0) snprintf(dir, n, "%s/%s.old", resume, name);   /* a crash between the renames */
    return LK_OK;
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

static lk_status read_param_state(trainer *t, lk_st_file *f, int i) {
    lk_param *p = lk_model_param(t->model, i);
    lk_tensor m = p->value, v = p->value;
    m.data = t->m[i];
    v.data = t->v[i];
    lk_status s;
    if ((s = read_tensor(t, f, "param", p->name, p->value)) || (s = read_tensor(t, f, "exp_avg", p->name, m))) return s;
    return read_tensor(t, f, "exp_avg_sq", p->name, v);
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
    for (int i = 0; !s && i < t->n_params; i++) s = read_param_state(t, f, i);
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

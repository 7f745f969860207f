/* checkpoint.h — safetensors files (read and write) and atomic file writes.
 *
 *   lk_st_file *f;
 *   if (lk_st_open("model.safetensors", &f)) puts(lk_last_error());
 *   lk_st_read(f, "model.norm.weight", &norm_weight);    // checks shape, converts float dtypes
 *   lk_st_close(f);
 *
 *   lk_st_writer *w;
 *   lk_st_writer_begin("out/model.safetensors", &w);
 *   lk_st_writer_add(w, "model.norm.weight", &t);        // t's data must live until commit
 *   lk_st_writer_commit(w);                              // tmp file, fsync, rename, fsync dir
 *
 * Reading trusts nothing: the header length against a limit and the file size, strict
 * UTF-8 JSON, known dtypes, shapes against byte spans, spans inside the data section,
 * contiguous and non-overlapping, no duplicate names. Any problem is LK_EIO with a
 * message naming the file and the problem. Files are written as the reference
 * `safetensors` library writes them: tensors ordered by dtype (widest first) then name,
 * the header padded with spaces so the data starts 8-byte aligned, which keeps every
 * tensor aligned to its element size. Metadata {"format": "pt"} is written unless set
 * otherwise: transformers refuses safetensors files without it. */
#ifndef LLMKERN_CHECKPOINT_H
#define LLMKERN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The reference implementation's limit on the JSON header (100 MB). */
#define LK_ST_MAX_HEADER 100000000u

typedef struct {
    const char *name;
    lk_dtype dtype;          /* LK_DTYPE_COUNT for a valid dtype llmkern has no type for (F64, U8, ...) */
    const char *st_dtype;    /* as in the file: "BF16", "F64", ... */
    int ndim;                /* 0 for a scalar */
    int64_t shape[LK_MAX_DIMS];
    const void *data;        /* inside the file's mapping; valid until lk_st_close */
    size_t nbytes;           /* may be 0 (a dimension of 0) */
} lk_st_tensor;

typedef struct lk_st_file lk_st_file;

/* Opens, maps (read-only) and validates path. On failure *out is NULL and nothing is
 * held. Errors: LK_EIO (cannot open, malformed), LK_ENOMEM, LK_EINVAL (NULL args). */
LK_API lk_status lk_st_open(const char *path, lk_st_file **out);
LK_API void lk_st_close(lk_st_file *f);                 /* NULL is fine */

/* Tensors in data order (ascending offsets); i < lk_st_count. */
LK_API size_t lk_st_count(const lk_st_file *f);
LK_API const lk_st_tensor *lk_st_at(const lk_st_file *f, size_t i);
/* The tensor of that name, or NULL. O(log n). */
LK_API const lk_st_tensor *lk_st_find(const lk_st_file *f, const char *name);
/* "__metadata__" entries: the value of key or NULL; and by index. */
LK_API const char *lk_st_metadata(const lk_st_file *f, const char *key);
LK_API size_t lk_st_metadata_count(const lk_st_file *f);
LK_API void lk_st_metadata_at(const lk_st_file *f, size_t i, const char **key, const char **value);

/* Copies tensor name into dst (a contiguous CPU tensor of the same shape; a 0-d file
 * tensor also fills a dst of shape [1]). Float dtypes (f32, bf16, f16) convert to dst's
 * dtype; other dtypes must match. Errors: LK_EIO (no such tensor), LK_ESHAPE,
 * LK_EDTYPE, LK_EINVAL (dst not contiguous or NULL data); dst untouched on error. */
LK_API lk_status lk_st_read(const lk_st_file *f, const char *name, const lk_tensor *dst);

/* Safetensors dtype text of an llmkern dtype ("BF16"). */
LK_API const char *lk_st_dtype_name(lk_dtype dt);

typedef struct lk_st_writer lk_st_writer;

/* Starts a file at path; nothing touches the disk before commit. */
LK_API lk_status lk_st_writer_begin(const char *path, lk_st_writer **out);
/* Adds a contiguous CPU tensor (any ndim 0..6, any lk_dtype) under name, in any order.
 * The writer keeps a pointer to t->data, not a copy: it must stay valid and unchanged
 * until commit or abort. Duplicate names are found at commit (LK_EINVAL).
 * Errors (writer still usable): LK_EINVAL (empty/reserved name, NULL data, not
 * contiguous, not on the CPU), LK_ENOMEM. */
LK_API lk_status lk_st_writer_add(lk_st_writer *w, const char *name, const lk_tensor *t);
/* The same, but converts t (a float dtype) to dtype `as` into a copy the writer owns:
 * f32 master weights saved as bf16, with t free to change afterwards. */
LK_API lk_status lk_st_writer_add_as(lk_st_writer *w, const char *name, const lk_tensor *t, lk_dtype as);
/* A "__metadata__" entry (string to string); setting a key again replaces it. */
LK_API lk_status lk_st_writer_set_metadata(lk_st_writer *w, const char *key, const char *value);
/* Writes "<path>.tmp", fsyncs it, renames it over path and fsyncs the directory. On any
 * error the tmp file is removed and a previous file at path is untouched. Frees w. */
LK_API lk_status lk_st_writer_commit(lk_st_writer *w);
/* Frees w; nothing was written. NULL is fine. */
LK_API void lk_st_writer_abort(lk_st_writer *w);

/* --- a checkpoint directory's weights, single or sharded -------------------------------
 * The two layouts of Hugging Face checkpoints: dir/model.safetensors, or
 * dir/model.safetensors.index.json whose "weight_map" names each tensor's shard
 * (model-00001-of-00002.safetensors, ...), as published checkpoints of 4B parameters
 * and more are.
 *
 *   lk_st_dir *d;
 *   if (lk_st_dir_open("Qwen3-8B", &d)) puts(lk_last_error());
 *   const char *file;
 *   const lk_st_tensor *t = lk_st_dir_find(d, "model.norm.weight", &file);
 *   lk_st_dir_read(d, "model.norm.weight", &dst);         // as lk_st_read
 *   lk_st_dir_close(d);
 *
 * Opening follows transformers: model.safetensors when present, else the index. Every
 * shard the index names is opened and validated as lk_st_open does; the index must be
 * JSON with a non-empty weight_map of plain file names in dir, and the index and the
 * shards must agree tensor for tensor (each mapped tensor in its shard, each shard's
 * tensor mapped to it, no name twice). Errors: LK_EIO naming the file and the problem,
 * LK_ENOMEM, LK_EINVAL (NULL arguments). */
typedef struct lk_st_dir lk_st_dir;
LK_API lk_status lk_st_dir_open(const char *dir, lk_st_dir **out);
LK_API void lk_st_dir_close(lk_st_dir *d);              /* NULL is fine */
LK_API int lk_st_dir_sharded(const lk_st_dir *d);       /* 1 when read through the index */
LK_API size_t lk_st_dir_file_count(const lk_st_dir *d); /* safetensors files open */
LK_API size_t lk_st_dir_count(const lk_st_dir *d);      /* tensors over all files */
/* Tensor i < lk_st_dir_count (file by file, each in data order); *path (optional) gets
 * the file holding it. */
LK_API const lk_st_tensor *lk_st_dir_at(const lk_st_dir *d, size_t i, const char **path);
/* The tensor of that name, or NULL; *path (optional) gets its file. */
LK_API const lk_st_tensor *lk_st_dir_find(const lk_st_dir *d, const char *name, const char **path);
/* lk_st_read from the file holding name; LK_EIO naming dir when none does. */
LK_API lk_status lk_st_dir_read(const lk_st_dir *d, const char *name, const lk_tensor *dst);

/* One tensor to save: a contiguous CPU tensor, written as dtype `as` (its own dtype, or
 * a float one for a float tensor: f32 master weights saved as bf16). */
typedef struct {
    const char *name;
    lk_tensor tensor;
    lk_dtype as;
} lk_st_entry;
/* Default shard limit of transformers' save_pretrained (max_shard_size "5GB"). */
#define LK_ST_DEFAULT_MAX_SHARD 5000000000ull
/* Writes the n tensors into dir (which must exist) as save_pretrained does: in the
 * given order, a new shard whenever the next tensor would take the current one past
 * max_shard_bytes (a larger tensor gets a shard of its own); one shard is the single
 * model.safetensors, more are model-0000k-of-0000n.safetensors and then the index
 * (metadata.total_size = the bytes of tensor data, weight_map sorted). Each file is
 * written atomically; afterwards the files of the other layout, or of another shard
 * count, that an earlier save left in dir are removed, so the directory loads as what
 * was just written. The tensors' data must stay valid until it returns. Errors:
 * LK_EINVAL (no directory, max_shard_bytes 0, a name twice, a bad `as`), LK_EIO naming
 * the file, LK_ENOMEM. */
LK_API lk_status lk_st_dir_write(const char *dir, const lk_st_entry *e, size_t n, uint64_t max_shard_bytes);

/* Atomic replacement of any file (config.json, optimizer state, loss.csv at a
 * checkpoint): writes go to "<path>.tmp"; commit fsyncs, renames over path and fsyncs
 * the directory; abort, or a commit that fails, removes the tmp file and leaves path as
 * it was. Commit and abort free f; after a failed write, commit repeats that error.
 * One writer per path at a time. Errors: LK_EIO naming the path and the system error,
 * LK_ENOMEM. */
typedef struct lk_atomic_file lk_atomic_file;
LK_API lk_status lk_atomic_file_begin(const char *path, lk_atomic_file **out);
LK_API lk_status lk_atomic_file_write(lk_atomic_file *f, const void *data, size_t n);
LK_API lk_status lk_atomic_file_commit(lk_atomic_file *f);
LK_API void lk_atomic_file_abort(lk_atomic_file *f);
/* All of data as the new content of path, atomically. */
LK_API lk_status lk_write_file_atomic(const char *path, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif

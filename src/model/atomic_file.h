/* atomic_file.h — internal to the library and its tests: a fault injection point for
 * the atomic writes of checkpoint.h, so a test can show that a write failing just
 * before its rename leaves the previous file intact. */
#ifndef LLMKERN_MODEL_ATOMIC_FILE_H
#define LLMKERN_MODEL_ATOMIC_FILE_H

/* The next lk_atomic_file_commit on this thread fails with LK_EIO after writing and
 * fsyncing the tmp file, just before the rename (as a crash there would). */
void lk_atomic_file_fail_next_commit(void);

#endif

/* suggest.c — "did you mean": the known name nearest to a misspelt one, by edit
 * distance with transpositions (so "fusde" finds "fused"). */
#include <string.h>
#include "llmkern/config.h"

enum { MAXLEN = 64 };

static int min3(int a, int b, int c) { return a < b ? (a < c ? a : c) : (b < c ? b : c); }

static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAXLEN || m >= MAXLEN) return MAXLEN;
    int d[MAXLEN][MAXLEN];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            d[i][j] = min3(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[n][m];
}

const char *lk_suggest(const char *word, const char *const *candidates) {
    const char *best = NULL;
    int best_d = MAXLEN;
    for (const char *const *c = candidates; word && c && *c; c++) {
        int d = edit_distance(word, *c);
        if (d < best_d) { best_d = d; best = *c; }
    }
    /* close: about a third of the word changed at most */
    int limit = word ? (int)(strlen(word) + 2) / 3 : 0;
    return best && best_d <= limit ? best : NULL;
}

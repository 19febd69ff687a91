/* Test support: VmFlags of the mapping that holds an address (vma_flags.h). */
#include "tests/support/vma_flags.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

bool vma_has_flag(const void *p, const char *flag, bool *found)
{
    *found = false;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[512];
    bool in = false, has = false;
    const uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        /* A mapping's first line: "lo-hi perms offset dev inode [path]". */
        char *dash = strchr(line, '-'), *space = strchr(line, ' ');
        if (dash && space && dash < space && sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            in = a >= lo && a < hi;
            continue;
        }
        if (in && !strncmp(line, "VmFlags:", 8)) {
            *found = true;
            char *save = NULL;
            for (char *tok = strtok_r(line + 8, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save))
                if (!strcmp(tok, flag)) has = true;
            break;
        }
    }
    fclose(f);
    return has;
}

#include "selector.h"

/* The index is the kind's public number: PickSelectorClass.Uniform == 0,
 * PickSelectorClass.Prioritized == 1, PickSelectorClass.Rank == 2. Append
 * new kinds at the end. */
const exr_selector_vtable *const exr_selector_kinds[] = {
    &exr_sel_uniform,
    &exr_sel_prioritized,
    &exr_sel_rank,
};
const int exr_selector_nkinds = (int)(sizeof exr_selector_kinds / sizeof exr_selector_kinds[0]);

int exr_selector_kind(const exr_selector *s)
{
    int k = 0;
    while (k < exr_selector_nkinds && exr_selector_kinds[k] != s->vt)
        k++;
    return k;
}

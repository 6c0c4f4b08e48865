/*
 * named.h - the binding's side of named fields (docs/design.md, "Named
 * fields and extras"): a buffer's state_spec and extras_spec as field sets,
 * dict arguments checked and turned into the core's field copy plans
 * (src/core/fields.h), the dicts of a batch and of an episode, and the
 * fields' part of the serialized metadata (docs/format.md).
 *
 *   state_spec={"img": ((84, 84), "uint8"), "vec": ((4,), "float32")}
 *   -> exr_fieldset { n = 2, bytes = 7072,
 *                     f[0] = {"img", uint8, (84, 84), 7056 B, off 0},
 *                     f[1] = {"vec", float32, (4,), 16 B, off 7056} }
 *
 * Fields are packed in the order given, with no padding: rows themselves
 * are not aligned (a row is as long as its fields), and the core moves
 * every field with memcpy, so padding would cost memory and buy nothing.
 */
#ifndef EXR_NAMED_H
#define EXR_NAMED_H

#include "binding.h"

#include "fields.h"

#define EXR_MAX_FIELDS 32
#define EXR_FIELD_NAME_MAX 64

typedef struct {
    PyObject *name;      /* str */
    PyArray_Descr *descr;
    int nd;
    npy_intp shape[NPY_MAXDIMS];
    size_t bytes, off;   /* item bytes; offset in the state or extras part of a row */
} exr_named;

typedef struct exr_fieldset {
    int n;
    size_t bytes;        /* all fields' bytes together */
    PyObject *names;     /* "'img', 'vec'", for messages */
    exr_named f[EXR_MAX_FIELDS];
} exr_fieldset;

/* The field set of a spec argument {name: (shape, dtype)} (arg names it in
 * errors). NULL with TypeError/ValueError. */
exr_fieldset *exr_fieldset_from_spec(PyObject *spec, const char *arg);
void exr_fieldset_free(exr_fieldset *fs);

/* {name: (shape, dtype)}, as the spec was given. A new reference. */
PyObject *exr_fieldset_spec(const exr_fieldset *fs);

/* One array per field from a dict argument (arg: "state", "extras", ...),
 * each of exactly the field's dtype, C-contiguous, of shape (lead...,
 * *shape); lead (nlead dims, -1: any) is shared, so a length that differs
 * between fields is an error naming the field. out[i] are new references;
 * on error none are held and an exception names the argument. */
int exr_fieldset_arrays(const exr_fieldset *fs, PyObject *obj, const char *arg, int nlead,
                        npy_intp *lead, PyArrayObject **out);
void exr_fieldset_release(const exr_fieldset *fs, PyArrayObject **arrs);

/* The copy plan of arrays (from exr_fieldset_arrays) into rows whose part
 * starts at byte base. */
void exr_fieldset_src_plan(const exr_fieldset *fs, size_t base, PyArrayObject **arrs,
                           exr_field_src *plan);
/* The fields of one item packed at dst (fs->bytes). */
void exr_fieldset_pack(const exr_fieldset *fs, PyArrayObject **arrs, unsigned char *dst);

/* New batch dicts {name: (B, L, *shape) array}, every array a view of one
 * block of batch memory (block.c). next: NULL when not wanted. */
int exr_fieldset_batch_new(const exr_fieldset *fs, exr_modstate *st, npy_intp B, npy_intp L,
                           PyObject **dict, PyObject **next);
/* Checks a dict passed back in out= (what: "out.state"): exactly the fields,
 * each a writeable C-contiguous array of the field's dtype and of shape
 * (B, L, *shape). *held: a new dict {name: array} of the arrays checked,
 * which the call uses whatever the caller's dict holds meanwhile. -1 with
 * ValueError/TypeError (*held NULL). */
int exr_fieldset_batch_check(const exr_fieldset *fs, PyObject *dict, npy_intp B, npy_intp L,
                             const char *what, PyObject **held);
/* The get_batch plan: field i from dict (and next_dict, if not NULL; seq:
 * dict holds the fields' (B, L + 1) arrays of shared next states). */
void exr_fieldset_dst_plan(const exr_fieldset *fs, size_t base, PyObject *dict,
                           PyObject *next_dict, bool seq, exr_field_dst *plan);

/* {name: array} of n items (lead >= 0: shape (n, *shape); -1: one item of
 * shape) copied from rows row_bytes apart, this set's part at base. */
PyObject *exr_fieldset_split(const exr_fieldset *fs, const unsigned char *rows, size_t row_bytes,
                             size_t base, npy_intp n, int lead);

/* The set in the serialized metadata: u8 count, then per field u8 name
 * length, the UTF-8 name, u8 nd, i64 dims, u8 dtype length, dtype.str.
 * -1 (with ValueError) when it does not fit in cap. */
int exr_fieldset_meta_put(const exr_fieldset *fs, unsigned char *buf, size_t cap, size_t *used);
/* Reads one back; NULL (no exception) if the bytes are not a valid set. */
exr_fieldset *exr_fieldset_meta_read(const unsigned char **p, size_t *left);

/* The state, final_state and extras arguments of record (T NULL) or
 * record_many (*T: the steps, found from the states) for a buffer with
 * named fields or extras, or with extras given: the arrays held, the copy
 * plan for exr_steps.fields, and the final state packed (fin, or NULL). */
typedef struct {
    PyArrayObject *arr[3][EXR_MAX_FIELDS]; /* state fields (or the one state array), final, extras */
    exr_field_src plan[2 * EXR_MAX_FIELDS];
    size_t nplan;
    unsigned char *fin;
} exr_fields_in;
int exr_fields_in_parse(ReplayObject *self, PyObject *state, PyObject *fin, PyObject *extras,
                        npy_intp *T, exr_fields_in *fi);
void exr_fields_in_release(ReplayObject *self, exr_fields_in *fi);
/* final_state alone (end_episode), checked and packed into fi->fin as
 * exr_fields_in_parse does it; -1 with an exception naming final_state
 * (fi then holds nothing). */
int exr_fields_in_final(ReplayObject *self, PyObject *fin, exr_fields_in *fi);

/* episode(h) of a buffer with named fields or extras: EpisodeData with
 * dicts where the buffer has them. */
PyObject *exr_replay_episode_fields(ReplayObject *self, int64_t h);

#endif

/*
 * replay_impl.h - what the ExperienceReplay type's files share: replay.c
 * (the type, construction, configuration attributes), replay_record.c,
 * replay_batch.c, replay_inspect.c, arrays.c (the NumPy arrays made) and the
 * selector methods in selector.c.
 */
#ifndef EXR_REPLAY_IMPL_H
#define EXR_REPLAY_IMPL_H

#include <math.h>

#include "binding.h"

static inline int priority_ok(double p) { return isfinite(p) && p >= 0; }

/* The ValueError for a selector handle this buffer does not have. NULL. */
static inline PyObject *unknown_selector(int64_t h) { return exr_unknown_selector(h); }

static inline exr_modstate *mstate(ReplayObject *self) { return exr_state_of_type(Py_TYPE(self)); }

/* args.c: 0 if p[0..n) are finite and >= 0, else -1 with a ValueError
 * naming the first other value and its index. */
int exr_check_priorities(const double *p, npy_intp n);

/* arrays.c: the fields of a Batch, in order. */
enum { F_STATE, F_ACTION, F_REWARD, F_NEXT, F_LEN, F_LEN_NEXT, F_EPI, F_POS, F_WEIGHT, F_INDEX,
       F_EXTRAS, F_SEQ, NFIELDS };
/* The arrays of a batch of B picks (new references): out's, checked, or
 * new ones. shared: shared next states (arrays[F_SEQ] the state_seq array
 * or dict, and state and state_next views of it: seq.c); else arrays[F_SEQ]
 * is None. */
int batch_arrays(ReplayObject *self, npy_intp B, PyObject *out, bool shared, PyObject **arrays);
/* plan: room for 2 * EXR_MAX_FIELDS entries (named.h), used when the
 * buffer has named fields or extras. */
void batch_out_of(ReplayObject *self, PyObject **arrays, exr_batch_out *o, exr_field_dst *plan);

/* seq.c: arrays[F_STATE] and arrays[F_NEXT] (new references) made the
 * views [:, :-1] and [:, 1:] of arrays[F_SEQ] (an array, or with named
 * state fields a dict of them). -1 with an exception. */
int exr_seq_views(ReplayObject *self, PyObject **arrays);
/* out.state and out.state_next checked to be those views of arrays[F_SEQ]
 * (out.state_seq, checked before), then taken into arrays[]. -1 with a
 * ValueError naming the array that is not. */
int exr_seq_out_check(ReplayObject *self, PyObject *out, PyObject **arrays);
/* Whether state and state_next are the views of seq (a state_seq array,
 * checked) that get_batch makes: 1 or 0, no exception. */
int exr_seq_views_ok(PyObject *state, PyObject *next, PyObject *seq, npy_intp L);
PyObject *batch_result(ReplayObject *self, PyObject **arrays, PyObject *out);
/* drops the spare arrays (arrays.c) */
void exr_spare_clear(ReplayObject *self);
PyObject *new_array(PyArray_Descr *d, npy_intp lead, int nd, const npy_intp *shape);

/* replay_batch.c: pick_epi and pick_pos as int64 arrays of one length n. */
int pick_arrays(PyObject *epi, PyObject *pos, PyArrayObject **e, PyArrayObject **p, npy_intp *n);

/* The methods, for replay.c's tables. */
PyObject *replay_record(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames);
PyObject *replay_record_many(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames);
PyObject *replay_new_episode(ReplayObject *self, PyObject *unused);
PyObject *replay_remove_episode(ReplayObject *self, PyObject *ho);
PyObject *replay_end_episode(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames);
PyObject *replay_new_pick_selector(ReplayObject *self, PyObject *args, PyObject *kw);
PyObject *replay_remove_pick_selector(ReplayObject *self, PyObject *ps);
PyObject *replay_pick_selector(ReplayObject *self, PyObject *ps);
PyObject *replay_pick_selectors(ReplayObject *self, PyObject *unused);
PyObject *replay_get_batch(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames);
PyObject *replay_gather(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *replay_set_priority(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames);
PyObject *replay_episode(ReplayObject *self, PyObject *ho);
Py_ssize_t replay_len(ReplayObject *self);
PyObject *get_num_episodes(ReplayObject *self, void *c);
PyObject *get_num_picks(ReplayObject *self, void *c);
PyObject *replay_handles(ReplayObject *self, PyObject *unused);
PyObject *replay_map_probes(ReplayObject *self, PyObject *unused);
PyObject *replay_picks(ReplayObject *self, PyObject *unused);
PyObject *replay_priority(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *replay_priority_stats(ReplayObject *self, PyObject *ps);
PyObject *replay_check(ReplayObject *self, PyObject *unused);

#endif

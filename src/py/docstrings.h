/*
 * docstrings.h - help() text of ExperienceReplay's methods: arguments,
 * return value, errors, GIL behaviour and cost, since docs/ does not ship in
 * the wheel. docs/api.md has the full reference; keep the two in step.
 */
#ifndef EXR_DOCSTRINGS_H
#define EXR_DOCSTRINGS_H

#include <Python.h>

PyDoc_STRVAR(exr_doc_replay,
"ExperienceReplay(state_shape, state_dtype='float32', action_shape=(), "
"action_dtype='int64', reward_dtype='float32', capacity=1000000, pick_len=1, "
"allow_short=False, eviction='fifo', seed=None, log=None, state_spec=None, "
"extras_spec=None)\n--\n\n"
"An experience replay buffer of episodes, drawn from as picks of pick_len\n"
"consecutive steps, uniformly or by priority.\n\n"
"Args:\n"
"  state_shape, action_shape: an int or a tuple of ints >= 1; () is a scalar.\n"
"  state_dtype, action_dtype: any bool, int, uint or float dtype.\n"
"  reward_dtype: float16, float32 or float64.\n"
"  capacity: the most records held (int >= 1) or None (unbounded); over it,\n"
"    whole episodes are evicted.\n"
"  pick_len: steps per pick, 1 .. 2**20.\n"
"  allow_short: ended episodes also have shorter picks at their end.\n"
"  eviction: 'fifo' (oldest episode first) or 'second_chance'.\n"
"  seed: an int in [0, 2**64) or None (OS entropy); same seed, same calls,\n"
"    same batches.\n"
"  log: an ExperienceLog that every recorded step is also written to\n"
"    (docs/log.md), or None.\n"
"  state_spec: {name: (shape, dtype)} instead of state_shape/state_dtype:\n"
"    named state fields; states are then dicts of arrays, in and out.\n"
"  extras_spec: {name: (shape, dtype)} of fields recorded with each step\n"
"    (record(..., extras={...})) and returned as batch.extras.\n\n"
"Raises TypeError for a wrong type, ValueError for a wrong value (both\n"
"name the argument). ExperienceReplay.for_spaces builds one from gymnasium\n"
"spaces. Thread-safe; record/get_batch/set_priority release the GIL (a\n"
"small record or get_batch keeps it when it does not have to wait and no\n"
"other thread's exreplay call, on any buffer or log, is running without it).");

PyDoc_STRVAR(exr_doc_new_episode,
"new_episode($self, /)\n--\n\n"
"Creates an empty episode.\n\n"
"Returns: its handle, an int (0, 1, 2, ... over all episodes, never reused).\n"
"Raises: MemoryError.\n"
"GIL: held, except while waiting for the buffer's lock. O(1).");

PyDoc_STRVAR(exr_doc_record,
"record($self, h, state, action, reward, final_state=None, terminated=False, "
"priority=None, extras=None)\n--\n\n"
"Appends one step to episode h.\n\n"
"Args:\n"
"  h: the handle the previous record returned; None (or an unknown,\n"
"    evicted or ended handle) starts a new episode.\n"
"  state: shape state_shape. action: shape action_shape. reward: a scalar.\n"
"  final_state: the next state after this step; ends the episode.\n"
"  terminated: True ends the episode on a terminal state.\n"
"  priority: initial priority (finite, >= 0) of the pick starting here;\n"
"    None: the selector's maximum so far.\n"
"  extras: {name: array} of every extras_spec field (required with one,\n"
"    refused without). With a state_spec, state and final_state are dicts\n"
"    {name: array} of exactly its fields.\n\n"
"Returns: the handle recorded into. Always continue with it: passing None\n"
"again starts a new episode every step, and no pick ever forms.\n"
"Raises: TypeError (h not None/int, unconvertible input, bad terminated or\n"
"  priority type, a state that is not a dict with a state_spec), ValueError\n"
"  (wrong shape, value out of range, negative or NaN priority, a missing or\n"
"  unknown field, extras without an extras_spec), MemoryError. On an error\n"
"  the buffer is unchanged.\n"
"GIL: released (kept when it need not wait, no log is attached and no other\n"
"thread's exreplay call is out without it). O(1) amortised, + O(log N) per new pick per\n"
"prioritized selector, + evictions.");

PyDoc_STRVAR(exr_doc_record_many,
"record_many($self, h, states, actions, rewards, final_state=None, terminated=False, "
"priorities=None, extras=None)\n--\n\n"
"Appends T >= 1 steps at once, exactly as T calls of record would.\n\n"
"Args:\n"
"  h: as for record.\n"
"  states (T, *state_shape), actions (T, *action_shape), rewards (T,),\n"
"  priorities (T,) or None; with named fields, states and extras are dicts\n"
"  of (T, *shape) arrays (each field read in place when C-contiguous).\n"
"  final_state, terminated: apply to the last step.\n\n"
"Returns: the handle recorded into last.\n"
"Raises: as record; T = 0 or mismatched lengths are a ValueError. Every\n"
"  input is validated before anything changes.\n"
"GIL: released for the whole rollout (a rollout under 8 KiB of rows is\n"
"recorded with it held, as record). O(T).");

PyDoc_STRVAR(exr_doc_new_pick_selector,
"new_pick_selector($self, kind, /, **params)\n--\n\n"
"Adds a pick selector.\n\n"
"Args:\n"
"  kind: PickSelectorClass.Uniform, .Prioritized or .Rank (or 0 / 1 / 2).\n"
"  params: Prioritized takes alpha=0.6 and beta=0.4, Rank alpha=0.7 and\n"
"    beta=0.5 (finite, >= 0); Uniform takes none.\n\n"
"Returns: a PickSelector (usable wherever an int handle is).\n"
"Raises: TypeError (non-int kind, unknown parameter, non-number value),\n"
"  ValueError (kind out of range, parameter not finite or < 0, already\n"
"  MAX_SELECTORS = 1024 selectors), MemoryError.\n"
"GIL: held. O(N) uniform, O(N log N) prioritized and rank.");

PyDoc_STRVAR(exr_doc_remove_pick_selector,
"remove_pick_selector($self, ps, /)\n--\n\n"
"Removes a pick selector; its handle becomes unknown to every method.\n\n"
"Args: ps: a PickSelector of this buffer or its int handle.\n"
"Returns: None.\n"
"Raises: TypeError (not a selector or int), ValueError (unknown handle or\n"
"  a selector of another buffer).\n"
"GIL: held.");

PyDoc_STRVAR(exr_doc_pick_selector,
"pick_selector($self, ps, /)\n--\n\n"
"A PickSelector for selector ps of this buffer, as new_pick_selector\n"
"returned it: for a restored buffer (unserialize, load, pickle, copy)\n"
"whose selectors came back without their objects, say to anneal beta.\n\n"
"Args: ps: an int handle (or a PickSelector of this buffer).\n"
"Returns: a new PickSelector object at every call, equal (==, hash) to\n"
"  every other one of this selector and to its handle; all of them read\n"
"  and set the same alpha and beta.\n"
"Raises: TypeError (not an int or a PickSelector), ValueError (a handle\n"
"  this buffer holds no selector for, removed ones too, or a PickSelector\n"
"  of another buffer).\n"
"GIL: held. O(selectors).");

PyDoc_STRVAR(exr_doc_pick_selectors,
"pick_selectors($self, /)\n--\n\n"
"A PickSelector for every selector this buffer holds, by ascending handle.\n\n"
"Returns: a list of new PickSelector objects (as pick_selector(h) gives\n"
"  them); [] when there is none.\n"
"GIL: held. O(selectors).");

PyDoc_STRVAR(exr_doc_get_batch,
"get_batch($self, batch_size, ps, out=None)\n--\n\n"
"Draws batch_size picks, with replacement, with selector ps.\n\n"
"Args:\n"
"  batch_size: an int >= 1.\n"
"  ps: a PickSelector of this buffer or its int handle.\n"
"  out: a Batch of the same batch_size whose arrays are refilled in place\n"
"    (no two of them sharing memory).\n\n"
"Returns: a Batch (state, action, reward, state_next, seq_len, seq_len_next,\n"
"  pick_epi, pick_pos, and .weight, .pick_index, .extras), or out itself.\n"
"  With a state_spec, state and state_next are dicts {name: (B, L, *shape)};\n"
"  .extras is {name: (B, L, *shape)} ({} without an extras_spec).\n"
"Raises: TypeError (non-int batch_size or ps, out not a Batch), ValueError\n"
"  (batch_size < 1, unknown selector, an out array of the wrong shape or\n"
"  dtype, two out arrays sharing memory, or no pick can be drawn: the\n"
"  message says why), MemoryError.\n"
"  On an error out is not written.\n"
"GIL: released (a batch of <= 64 picks and <= 16 KiB of rows keeps it, as\n"
"record). O(B*L), + O(B log N) prioritized; never scans the buffer.");

PyDoc_STRVAR(exr_doc_set_priority,
"set_priority($self, ps, pick_epi, pick_pos, priorities, pick_index=None)\n--\n\n"
"Sets the priorities of picks (pick_epi[i], pick_pos[i]) for selector ps.\n"
"Also set_priority(ps, batch, priorities): a Batch's picks.\n\n"
"Args:\n"
"  ps: a PickSelector or int handle.\n"
"  pick_epi, pick_pos: 1-D, same length (a batch's fields), int64 values\n"
"    (not bools; a uint64 value beyond int64 is a ValueError).\n"
"  priorities: 1-D of that length, or one number for all; finite, >= 0.\n"
"  pick_index: None, or 1-D of that length: the batch's pick_index, where\n"
"    each pick was in the pick table; the update goes there directly while\n"
"    it still holds that pick (same result, faster; as the batch form).\n\n"
"Returns: how many were applied (evicted picks are skipped; 0 on a\n"
"  uniform selector). Each also raises the selector's maximum so far.\n"
"Raises: TypeError (unconvertible input), ValueError (mismatched lengths,\n"
"  negative/NaN/infinite priority, unknown selector); nothing changes then.\n"
"GIL: released. O(K log N).");

PyDoc_STRVAR(exr_doc_episode,
"episode($self, h, /)\n--\n\n"
"A copy of episode h.\n\n"
"Args: h: an episode handle.\n"
"Returns: EpisodeData(state, action, reward, final_state, ended, terminated),\n"
"  new arrays of the episode's n steps; final_state is None if none was given;\n"
"  .extras {name: (n, *shape)}. With a state_spec, state and final_state are\n"
"  dicts of arrays.\n"
"Raises: TypeError (h not an int), ValueError (h not held: evicted or never\n"
"  created).\n"
"GIL: held while copying. O(n).");

PyDoc_STRVAR(exr_doc_remove_episode,
"remove_episode($self, h, /)\n--\n\n"
"Evicts episode h now, as capacity would: its records leave len(buf), its\n"
"picks leave every selector (their priorities with them), and a record into\n"
"h afterwards starts a new episode. A record call copying into h in another\n"
"thread finishes first. The removal is not logged (like an eviction).\n\n"
"Args: h: an episode handle.\n"
"Returns: None.\n"
"Raises: TypeError (h not an int), ValueError (h not held: evicted, removed\n"
"  or never created); the buffer is then unchanged.\n"
"GIL: released. O(n + m S log N) for n records, m picks, S selectors.");

PyDoc_STRVAR(exr_doc_end_episode,
"end_episode($self, h, final_state=None, terminated=False)\n--\n\n"
"Ends open episode h without recording a step: exactly what its last record\n"
"call would have done had it carried final_state and terminated. final_state\n"
"becomes the last step's next state, terminated marks it terminal, and the\n"
"picks that needed it come to exist, with the priorities given when their\n"
"steps were recorded. For an episode whose end is known only after its last\n"
"step was recorded (an RLlib fragment of no steps that is done). An attached\n"
"log records the end (docs/log.md).\n\n"
"Args:\n"
"  h: the handle of an open episode with at least one step.\n"
"  final_state: None, or a state (a dict of fields with a state_spec).\n"
"  terminated: a bool (or int, NumPy bool).\n\n"
"Returns: True if it ended h; False if h is a handle of this buffer whose\n"
"  episode is no longer held (evicted or removed): there is nothing to end\n"
"  in the buffer, but an attached log records the end if the episode went\n"
"  open, with steps, under a log (its steps are in the log; docs/log.md).\n"
"Raises: TypeError (h not an int, terminated not a bool, final_state\n"
"  unconvertible), ValueError (final_state's shape; h ended already, h with\n"
"  no step, or h no episode of this buffer has had), MemoryError. On any\n"
"  error the buffer is unchanged.\n"
"GIL: released. O(S log N) for each pick that comes to exist (at most\n"
"  pick_len).");

PyDoc_STRVAR(exr_doc_serialize,
"serialize($self, level=6)\n--\n\n"
"The whole buffer as bytes: configuration, episodes, picks, selectors with\n"
"their priorities and generator states, eviction state (docs/format.md).\n\n"
"Args: level: zlib level 0-9 (0 stores uncompressed).\n"
"Returns: bytes, for unserialize.\n"
"Raises: TypeError (level not an int), ValueError (level out of range),\n"
"  MemoryError.\n"
"GIL: released while writing; other threads' calls wait for it. O(size).");

PyDoc_STRVAR(exr_doc_unserialize,
"unserialize(data, /)\n--\n\n"
"A new buffer from serialize()'s bytes; it draws the same batches as the\n"
"original would.\n\n"
"Args: data: any contiguous bytes-like object (bytes, memoryview, uint8 array).\n"
"Returns: a new ExperienceReplay (use int selector handles on it).\n"
"Raises: TypeError (not bytes-like), ValueError for anything that is not a\n"
"  valid serialized buffer (never crashes), MemoryError.\n"
"GIL: released while reading and validating. O(size).");

PyDoc_STRVAR(exr_doc_save,
"save($self, path, level=6, progress=None)\n--\n\n"
"Writes the bytes serialize(level) would return to path, streaming,\n"
"replacing the file atomically (temp file, fsync, rename, directory fsync).\n\n"
"Args:\n"
"  path: str, bytes or os.PathLike. level: zlib 0-9.\n"
"  progress: called as progress(done, total) every 64 MiB written, with the\n"
"    buffer locked (it must not use the buffer).\n\n"
"Returns: None.\n"
"Raises: TypeError (bad path/level/progress type), ValueError (level out of\n"
"  range), OSError with the path; on any error the old file is untouched.\n"
"GIL: released while compressing and writing. O(size).");

PyDoc_STRVAR(exr_doc_load,
"load(path, /)\n--\n\n"
"A new buffer from a file written by save().\n\n"
"Args: path: str, bytes or os.PathLike.\n"
"Returns: a new ExperienceReplay.\n"
"Raises: OSError (missing or unreadable file), ValueError (not a regular\n"
"  file, or not a valid serialized buffer), TypeError (bad path type).\n"
"GIL: released while reading. O(size).");

PyDoc_STRVAR(exr_doc_for_spaces,
"for_spaces(observation_space, action_space, **kwargs)\n--\n\n"
"A buffer whose state and action shapes and dtypes match a pair of\n"
"gymnasium spaces.\n\n"
"Args:\n"
"  observation_space, action_space: Box, MultiDiscrete or MultiBinary (shape\n"
"    and dtype kept) or Discrete (a scalar int64); a Dict observation space\n"
"    of such spaces becomes a state_spec, one named field per entry.\n"
"  kwargs: the other constructor arguments (capacity, pick_len, ...).\n\n"
"Returns: a new ExperienceReplay.\n"
"Raises: ValueError naming the argument for any other space (Tuple, a\n"
"  nested Dict, ...: flatten them first), TypeError if kwargs repeat a shape,\n"
"  dtype or state_spec.\n"
"GIL: held.");

PyDoc_STRVAR(exr_doc_priority_stats,
"priority_stats($self, ps, /)\n--\n\n"
"Totals of selector ps's draw weights p**alpha, all read at one moment.\n\n"
"Args: ps: a PickSelector of this buffer or its int handle.\n"
"Returns: (total, min_positive, num_picks): the sum of p**alpha, the\n"
"  smallest positive one (inf if none) and the picks held; a uniform\n"
"  selector reports (num_picks, 1.0, num_picks), a rank selector the\n"
"  weights of the ranks r**-alpha, r = 1..N. What a sharded replay needs\n"
"  to draw across buffers and normalise weights globally.\n"
"Raises: TypeError (not a selector or int), ValueError (unknown selector).\n"
"GIL: held. O(1).");

PyDoc_STRVAR(exr_doc_stored_priorities,
"stored_priorities($self, ps, pick_epi, pick_pos, /)\n--\n\n"
"The stored draw weights p**alpha of given picks of a prioritized selector.\n\n"
"Args: ps: a prioritized PickSelector or handle; pick_epi, pick_pos: 1-D,\n"
"  same length, as set_priority takes them.\n"
"Returns: a float64 array (the values are stored as float32); a rank\n"
"  selector stores the priority p itself.\n"
"Raises: TypeError (unconvertible input), ValueError (a pick that does not\n"
"  exist, a uniform or unknown selector, mismatched lengths).\n"
"GIL: held. O(count).");

#endif

"""The records batchfit keeps on disk, one module per kind: what each file holds, written and read in one place.

`batchfit.layout` says where a sweep's files are; these modules say what they hold: the compile stamp, the
plan, the batch manifests (with each dataset's outcome), failure records, provenance sidecars and SBC's truth
records. Each is a frozen dataclass with ``write(path)`` and ``read(path)`` (`batchfit.records.json_record`):
its file names its kind and format version, and a reader refuses a file of another kind or version with a
`RecordError` that names the file and what to do. The fit file, NetCDF, keeps its root attributes' names and
format version in `batchfit.records.fit_attributes`. Records that one stage alone writes and reads stay with
it, through the same envelope: the refits' plan and manifests (`batchfit.fitting.refit_records`) and the
prediction plan (`batchfit.sweep.predict_plan`).
"""

"""The records batchfit keeps on disk, one module per kind: what each file holds, written and read in one place.

`batchfit.layout` says where a sweep's files are; these modules say what they hold. Each JSON record is a
frozen dataclass with ``write(path)`` and ``read(path)`` (`batchfit.records.json_record`): its file names its
kind and format version, and a reader refuses a file of another kind or version with a `RecordError` that
names the file and what to do. The fit file, NetCDF, keeps its root attributes' names and format version in
`batchfit.records.fit_attributes`.
"""

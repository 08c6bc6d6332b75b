"""Foreign formats into simdist field dicts, below ``simdist.spec``.

- :mod:`simdist.io.text`: YAML and JSON text -> Python data, bounded (duplicate keys, alias
  expansion, nesting depth) with one-line errors naming file, line and column;
- :mod:`simdist.io.hf`: a Hugging Face ``config.json`` -> model fields;
- :mod:`simdist.io.deepspeed`: a DeepSpeed config -> plan fields;
- :mod:`simdist.io.accelerate`: an Accelerate config -> cluster and plan fields.

Nothing here reads files (``simdist.spec.files`` does) or imports ``simdist.spec``: the
converters take parsed dicts and return plain dicts in the scenario file's spelling, reporting
problems into a :class:`simdist.errors.Collector`.
"""

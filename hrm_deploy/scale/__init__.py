"""Scale-out on Ray: batch work spread over Ray actors (``arc-eval --ray``, ``solve FILE --ray``) and
serving replicas on Ray Serve (``serve --ray``), with answers identical to one process.

- ``cluster``: joining a Ray cluster or starting a local one (and stopping it), the resources each
  worker asks for;
- ``pool``: a pool of actors, each holding one runner of the artifact, that keeps work in flight and
  retries the work of an actor that died on a new one;
- ``batch``: ``solve`` and ``arc-eval`` on the pool, outputs byte-identical to the single-process run.

Ray is an extra (``pip install -e '.[scale]'``); nothing here is imported unless ``--ray`` is given.
"""

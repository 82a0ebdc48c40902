"""Integrations of bcrecord with training frameworks.

Each integration is a submodule that imports its framework, so importing this
package alone imports nothing heavy:

* :mod:`bcrecord.integrations.mmengine` — ``RecorderHook`` and
  ``RecorderVisualizationHook`` for MMEngine runners (``pip install 'bcrecord[mmengine]'``).
  A config needs only ``custom_imports=dict(imports=['bcrecord.integrations.mmengine'])``
  plus the hook in ``custom_hooks``.
* :mod:`bcrecord.integrations.lightning` — ``RecorderCallback`` for Lightning
  trainers (``pip install 'bcrecord[lightning]'``).
* :mod:`bcrecord.integrations.transformers` — how recordings copy transformers' key/value
  caches (loaded by the core the first time it copies a transformers object).
* :mod:`bcrecord.integrations.torchvision` — how recordings copy torchvision's
  ``ImageList`` (loaded by the core the first time it copies a torchvision object).

>>> import bcrecord.integrations
>>> bcrecord.integrations.__name__
'bcrecord.integrations'
"""

"""One plain torch kernel per registered slot, ``<slot with . as _>.py``: the text ``cacheon new`` writes.

Never imported by Cacheon: each file is read as text and becomes a bundle's kernel, so it must pass
``cacheon scan`` and ``cacheon verify`` on its own (tests/cli/test_new.py runs both for every slot).
Its docstring's first line is the new bundle's description.
"""

"""The two names of zarr-python's private API the store needs, imported here alone.

zarr says its ``zarr.core`` "is considered private API and should not be imported directly by
3rd-party code", and means to rename it (zarr-developers/zarr-python#2621); 3.1.6 gives neither
name a public home. Imported across seven modules, a rename stopped every command, reading a
store included; now it is this file's two lines to change.

- ``sync``: runs a zarr coroutine on zarr's own event loop, so a batch of chunk reads or writes
  goes out at once from the store's synchronous code.
- ``GroupMetadata``: a group's ``zarr.json`` document, built and checked when the root's
  consolidated metadata (the run listing, the sweep index) is written whole.
"""

from zarr.core.group import GroupMetadata
from zarr.core.sync import sync

__all__ = ["GroupMetadata", "sync"]

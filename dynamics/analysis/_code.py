"""The dynamics code's hash, taken as `dynamics.analysis` is imported, before any analyser is.

`dynamics analyse` keeps an analysis stamped with this hash (`dynamics.analyse.source_of`). Taken
first as it wrote its first analysis, the hash read files edited since the analysers were
imported, and stamped the old code's results as the new code's.
"""

from dynamics.provenance import process_code_hash

process_code_hash()

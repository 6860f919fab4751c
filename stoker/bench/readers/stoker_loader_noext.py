"""Reader: stoker.Loader as stoker_loader.py runs it, with stoker's region-decode extension refused
at import, so JPEGs are decoded whole by simplejpeg: what an install built without libjpeg-turbo's
headers runs. Only this script refuses the extension; the library has no switch for it."""

from __future__ import annotations

import sys

EXTENSION = "stoker.decode._jpeg_region"


class RefuseRegionDecode:
    """An import hook that makes importing the extension fail as if it had not been built."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == EXTENSION:
            raise ImportError(f"{EXTENSION} refused by {__file__}")


if __name__ == "__main__":
    sys.meta_path.insert(0, RefuseRegionDecode())
    import stoker_loader  # after the hook: it imports the Loader's modules at once

    stoker_loader.main()
    per_image = sys.modules.get("stoker.decode.per_image")  # imported by a run, not by prepare
    if per_image is not None and per_image.decode_region is not None:
        sys.exit(f"{EXTENSION} was used: this row did not measure the fallback")

"""`make test` collects the slowest test files first (tests/conftest.py, for xdist's worksteal): each
file named there exists, and collection puts its tests ahead of the rest in the listed order."""
from tests.conftest import SLOW_FILES_FIRST
from tests.support.paths import REPO


def test_every_slow_file_listed_first_exists():
    missing = [path for path in SLOW_FILES_FIRST if not (REPO / path).is_file()]
    assert not missing, f"renamed or removed: update tests/conftest.py SLOW_FILES_FIRST: {missing}"
    assert len(set(SLOW_FILES_FIRST)) == len(SLOW_FILES_FIRST)


def test_collection_puts_the_slow_files_first(request):
    root = request.config.rootpath
    files = []
    for item in request.session.items:
        path = item.path.relative_to(root).as_posix()
        if not files or files[-1] != path:
            files.append(path)
    collected = set(files)
    listed = [path for path in SLOW_FILES_FIRST if path in collected]  # a run of some files collects only those
    assert files[:len(listed)] == listed
    assert len(files) == len(collected)  # no file split in two: module-scoped fixtures are built once

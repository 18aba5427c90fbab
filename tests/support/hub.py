"""A stand-in for the Hub at the ``HfApi`` boundary: :class:`FakeHub` records what each commit would contain."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import CommitInfo, HfApi, RepoUrl, hf_api


TOKEN = "hf_test_token"


class FakeHub:
    """Records the calls HfApi would send to the Hub; ``commits`` holds each commit's files as bytes."""

    def __init__(self) -> None:
        self.repos: list[dict] = []
        self.branches: list[dict] = []
        self.commits: list[dict] = []
        self.folder_uploads: list[dict] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        hub = self
        upload_folder = HfApi.upload_folder

        def recorded_upload_folder(self, **kwargs):
            hub.folder_uploads.append(kwargs)
            return upload_folder(self, **kwargs)

        monkeypatch.setattr(hf_api, "is_xet_available", lambda: False)
        monkeypatch.setattr(HfApi, "_validate_yaml", lambda self, content, **kwargs: None)  # a Hub request
        monkeypatch.setattr(HfApi, "upload_folder", recorded_upload_folder)

        def create_repo(self, repo_id, *, token=None, private=None, exist_ok=False, **kwargs):
            hub.repos.append(dict(repo_id=repo_id, token=token, private=private, exist_ok=exist_ok, **kwargs))
            # The Hub puts a bare name into the token owner's namespace.
            return RepoUrl(f"https://huggingface.co/{repo_id if '/' in repo_id else 'me/' + repo_id}")

        def create_branch(self, repo_id, *, branch, token=None, exist_ok=False, **kwargs):
            hub.branches.append(dict(repo_id=repo_id, branch=branch, token=token, exist_ok=exist_ok))

        def create_commit(self, repo_id, operations, *, commit_message, token=None, revision=None, create_pr=None,
                          **kwargs):
            files = {}
            for op in operations:
                with op.as_file() as handle:
                    files[op.path_in_repo] = handle.read()
            hub.commits.append(dict(repo_id=repo_id, files=files, commit_message=commit_message, token=token,
                                    revision=revision, create_pr=create_pr, **kwargs))
            return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/abc", commit_message=commit_message,
                              commit_description="", oid="abc", pr_url=None)

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "create_branch", create_branch)
        monkeypatch.setattr(HfApi, "create_commit", create_commit)

    def only_commit(self) -> dict:
        assert len(self.commits) == 1, f"expected one commit, got {len(self.commits)}"
        return self.commits[0]


def materialise(files: dict[str, bytes], folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder

"""uploads.expected_sha256: a resumable upload's whole-upload digest

A tus upload's parts can each carry an ``Upload-Checksum``, but nothing
said what the joined upload had to be: parts sent right, from a file that
changed between two sessions of the client, made an attachment of bytes
nobody had. A creation may now send RFC 9530 ``Repr-Digest`` (``sha-256``);
the last byte's handoff compares the joined bytes with it and refuses a
mismatch (``422 digest_mismatch``), as a POST's ``Content-Digest`` is.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("uploads", sa.Column("expected_sha256", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("uploads", "expected_sha256")

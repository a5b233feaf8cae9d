"""uploads: resumable (tus) uploads in progress

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "uploads",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("upload_length", sa.BigInteger, nullable=False),
        sa.Column("upload_offset", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("upload_metadata", sa.Text),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("attachment_id", UUID(as_uuid=True), sa.ForeignKey("attachments.id")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("upload_length > 0 AND upload_offset BETWEEN 0 AND upload_length",
                           name="uploads_offset_check"),
        sa.CheckConstraint("attachment_id IS NULL OR upload_offset = upload_length", name="uploads_complete_check"),
    )
    op.create_index("uploads_expires_idx", "uploads", ["expires_at"])


def downgrade() -> None:
    op.drop_table("uploads")

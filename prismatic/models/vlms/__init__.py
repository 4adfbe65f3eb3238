"""VLMs built from a vision backbone, a projector and an LLM backbone."""

from prismatic.models.vlms.prismatic import VLA_STAGES, PrismaticVLM

__all__ = ["VLA_STAGES", "PrismaticVLM"]

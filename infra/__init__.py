"""Infrastructure: object stores (local files, S3) and MPI / torch.distributed setup, plus deployment assets."""

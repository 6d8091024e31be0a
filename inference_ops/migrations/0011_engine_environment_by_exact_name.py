from django.db import migrations, models


class Migration(migrations.Migration):
    """Help text only: an engine row's environment is allowed by exact name."""

    dependencies = [
        ('inference_ops', '0010_endpoint_apis'),
    ]

    operations = [
        migrations.AlterField(
            model_name='engineprocess',
            name='environment',
            field=models.JSONField(blank=True, default=dict, help_text='Extra environment, e.g. {"HF_HOME": "/data", "OMP_NUM_THREADS": "8"}; only engine variables allowed by exact name (inference_ops/policy.py: CUDA_VISIBLE_DEVICES, HF_HOME, VLLM_CPU_KVCACHE_SPACE, NCCL_DEBUG, OMP_NUM_THREADS, …), never one that loads code or names host files (LD_*, PATH, PYTHON*, CUDA_INJECTION64_PATH, OMP_TOOL_LIBRARIES, TRITON_CACHE_MANAGER, VLLM_SERVER_DEV_MODE, …). The engine never sees the gateway\'s own environment.'),
        ),
    ]

from django.db import migrations, models


class Migration(migrations.Migration):
    """Help texts only: an engine row's environment is allowed by exact name and its key comes
    from the supervisor, and an engine that loads adapters at run time requires that key."""

    dependencies = [
        ('inference_ops', '0010_endpoint_apis'),
    ]

    operations = [
        migrations.AlterField(
            model_name='engineprocess',
            name='environment',
            field=models.JSONField(blank=True, default=dict, help_text='Extra environment, e.g. {"HF_HOME": "/data", "OMP_NUM_THREADS": "8"}; only engine variables allowed by exact name (inference_ops/policy.py: CUDA_VISIBLE_DEVICES, HF_HOME, VLLM_CPU_KVCACHE_SPACE, NCCL_DEBUG, OMP_NUM_THREADS, …), never one that loads code or names host files (LD_*, PATH, PYTHON*, CUDA_INJECTION64_PATH, OMP_TOOL_LIBRARIES, TRITON_CACHE_MANAGER, VLLM_SERVER_DEV_MODE, …). The engine never sees the gateway\'s own environment, and gets its API key from the supervisor.'),
        ),
        migrations.AlterField(
            model_name='engineprocess',
            name='runtime_lora_updating',
            field=models.BooleanField(default=False, help_text='Allow loading and unloading adapters at run time (VLLM_ALLOW_RUNTIME_LORA_UPDATING): the adapters of this row, sent by the gateway, whose key the engine requires.'),
        ),
    ]
